"""SQLite store: the embedded default. One file, WAL, durable group commit.

How it keeps the contract:

* **One writer thread** owns the write connection. ``transact`` queues the function;
  the thread takes every function waiting (up to a batch bound), opens one
  ``BEGIN IMMEDIATE`` transaction, runs them back to back, then commits once. If one
  raises, the batch is rolled back and run again with a ``SAVEPOINT`` per function, so
  the failing one is undone alone. With
  ``synchronous=FULL`` in WAL mode that commit is one fsync of the log, shared by the
  whole batch (group commit); only after it returns are the callers answered, so an
  answered transaction survives ``kill -9`` and power loss.
* **Several processes** may open the same file: ``BEGIN IMMEDIATE`` takes SQLite's
  write lock and ``busy_timeout`` waits for it, so writes from all processes are
  serialized by SQLite itself. When the writer is idle it watches
  ``PRAGMA data_version`` and reports changes made by other processes to
  :meth:`Store.on_external_change` within a quarter second.
* **Reads** (``read``) run on a second connection in their own thread, from a WAL
  snapshot, without waiting for the writer.
* **Migrations** are numbered scripts applied under the write lock, recorded in
  ``schema_migrations``; a file written by newer code is refused, and a write after a
  newer backchannel migrated the file under the running hub fails (a rolling upgrade).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import queue
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from backchannel.errors import AlreadyExists, BackchannelError, StoreError
from backchannel.files import private_dirs
from backchannel.stores.base import (
    SCHEMA_VERSION,
    Store,
    Tx,
    schema_moved_on,
    schema_put_back,
    tell_finished,
)
from backchannel.stores.sqlite.schema import migrate
from backchannel.stores.sqlite.tx import SqliteTx

__all__ = ["JOURNAL_SIZE_LIMIT", "READER_THREAD", "WRITER_THREAD", "SqliteStore", "sqlite_path"]

T = TypeVar("T")
log = logging.getLogger("backchannel.stores.sqlite")

#: The first bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"

#: The names of the store's two threads (``threading.Thread.name``).
WRITER_THREAD = "bc-sqlite-writer"
READER_THREAD = "bc-sqlite-reader"


@dataclass(slots=True)
class _Job:
    fn: Callable[[Tx], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    group: _Group | None = None  # one of ``transact_each``'s functions
    index: int = 0  # its place in the group


#: An answer of a ``transact_each`` group not in yet, and one whose function was told
#: how it ended (its caller stopped waiting).
_PENDING: Any = object()
_TOLD: Any = object()


class _Group:
    """The answers of one ``transact_each`` call, gathered on the event loop; its
    future resolves once every function has its answer."""

    __slots__ = ("answers", "fns", "future", "left")

    def __init__(
        self, future: asyncio.Future[list[Any]], fns: Sequence[Callable[[Tx], Any]]
    ) -> None:
        self.future = future
        self.fns = fns
        self.answers: list[Any] = [_PENDING] * len(fns)
        self.left = len(fns)

    def answer(self, index: int, value: Any, error: BaseException | None) -> None:
        future = self.future
        if future.done():
            if future.cancelled():
                self._tell(index, error is None)
            return
        if error is not None and not isinstance(error, Exception):
            future.set_exception(error)  # a cancellation is raised, not answered
            return
        self.answers[index] = value if error is None else error
        self.left -= 1
        if self.left == 0:
            future.set_result(self.answers)

    def _tell(self, index: int, committed: bool) -> None:
        """The caller stopped waiting: each function is told how it ended, those
        answered before it learnt so as well (:func:`tell_finished`)."""
        answers = self.answers
        for i, got in enumerate(answers):
            if got is not _PENDING and got is not _TOLD:
                answers[i] = _TOLD
                tell_finished(self.fns[i], not isinstance(got, Exception))
        answers[index] = _TOLD
        tell_finished(self.fns[index], committed)


def sqlite_path(url: str) -> Path:
    """``sqlite:///abs/path.db`` (absolute), ``sqlite://rel/path.db`` (relative) or a path."""
    if url.startswith("sqlite://"):
        rest = url[len("sqlite://") :]
        return Path("/" + rest.lstrip("/")) if rest.startswith("/") else Path(rest)
    return Path(url)


#: The size (bytes) the write-ahead log is cut back to (``PRAGMA journal_size_limit``)
#: when a checkpoint lets it start over: what SQLite's automatic checkpoint lets it grow
#: to (1000 pages of 4 KiB), so steady traffic reuses the file as it is, and only a log a
#: burst grew beyond it (a reader holding old pages) is given back to the disk.
JOURNAL_SIZE_LIMIT = 4 << 20

#: SQLite's automatic checkpoint, in pages of log (its own default), and the least the
#: writer lowers it to on a disk with little room (see :class:`_Log`).
_CHECKPOINT_PAGES = 1000
_FEWEST_CHECKPOINT_PAGES = 16

#: Free space below which the writer looks at the disk after every batch rather than
#: every ``_ROOM_EVERY`` seconds, and a checkpoint that could not be done (a full disk)
#: is tried again every ``_RETRY_CHECKPOINT`` seconds.
_LITTLE_ROOM = 64 << 20
_ROOM_EVERY = 1.0
_RETRY_CHECKPOINT = 0.25

#: how long a statement waits for another process's lock (ms)
_BUSY_MS = 30000

#: how long opening waits for another process that is turning a new file into WAL
_OPEN_WAIT = 30.0
_pause = time.sleep  # between two tries of that switch


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    try:
        _into_wal(conn, path)
    except BaseException:
        conn.close()
        raise
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute("PRAGMA cache_size = -32768")
    conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
    return conn


def _into_wal(conn: sqlite3.Connection, path: Path) -> None:
    """``journal_mode = WAL``, waiting for other processes. Turning a new file into WAL
    needs it to itself, and SQLite answers "database is locked" at once, without its busy
    timeout, while another process opening the same new file holds it (two hubs started
    together on one file); the switch is tried again until it is done or ``_OPEN_WAIT``
    has passed. SQLite answers with the old mode, without an error, only where WAL cannot
    work at all (a file system without the shared memory it needs): that fails at once."""
    deadline = time.monotonic() + _OPEN_WAIT
    pause = 0.005
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise
        else:
            if mode == "wal":
                return
            raise StoreError(
                f"cannot put SQLite store {path} into WAL mode: SQLite kept journal mode "
                f"{mode!r}, so this file system cannot give WAL the shared memory it needs; "
                "put the store on a local disk, or use PostgreSQL"
            )
        if time.monotonic() >= deadline:
            raise StoreError(
                f"cannot put SQLite store {path} into WAL mode: another process holds it "
                f"(still locked after {_OPEN_WAIT:g} s); stop the other process or wait for "
                "it, then start again"
            )
        _pause(pause)
        pause = min(pause * 2, 0.2)


def _resolve_all(results: list[tuple[_Job, Any, BaseException | None]]) -> None:
    for job, value, error in results:
        if job.group is not None:
            job.group.answer(job.index, value, error)
            continue
        future = job.future
        if future.done():
            if future.cancelled():  # its caller stopped waiting: tell the function
                tell_finished(job.fn, error is None)
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


class SqliteStore(Store):
    """The embedded store; see the module docstring for how it keeps the contract."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_batch: int = 512,
        on_statement: Callable[[str], None] | None = None,
    ) -> None:
        """``on_statement`` sees every SQL statement the reader and writer run, with
        its values filled in (SQLite's trace hook): for diagnostics and the query-plan
        tests, never for production logging."""
        self.path = sqlite_path(os.fspath(path))
        self._on_statement = on_statement
        self.url = f"sqlite://{self.path}"
        self._max_batch = max_batch
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._reads: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # results waiting for their event loop to pick them up (see ``_answer``)
        self._answers: dict[
            asyncio.AbstractEventLoop, list[tuple[_Job, Any, BaseException | None]]
        ] = {}
        self._answers_lock = threading.Lock()
        # the file's schema cookie when the writer last found its schema this code's own
        self._schema_cookie: int | None = None
        self._log: _Log  # the writer's care of the write-ahead log (its thread sets it)

    async def open(self) -> None:
        if self._writer is not None:
            return
        self._loop = asyncio.get_running_loop()
        try:
            await asyncio.to_thread(self._create_private)
            await asyncio.to_thread(self._migrate)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {self.path}: {exc}") from exc
        self._writer = threading.Thread(target=self._write_loop, name=WRITER_THREAD, daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name=READER_THREAD, daemon=True)
        self._writer.start()
        self._reader.start()

    def _connection(self) -> sqlite3.Connection:
        conn = _connect(self.path)
        if self._on_statement is not None:
            conn.set_trace_callback(self._on_statement)
        return conn

    def _create_private(self) -> None:
        """Create the database file 0600 (in new 0700 directories) before SQLite opens it:
        SQLite gives ``-wal`` and ``-shm`` the mode of the database file. An existing
        database and its companions are narrowed to 0600; an existing file that is not
        a SQLite database is refused, its mode and content left as they are."""
        try:
            private_dirs(self.path.parent)  # the parents it makes too, not the umask's
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                head = os.read(fd, len(_SQLITE_HEADER))
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreError(
                f"cannot create SQLite store {self.path} privately: {exc}; check that the "
                "directory exists and belongs to the user the hub runs as"
            ) from exc
        if head and (head != _SQLITE_HEADER or _foreign(self.path)):
            what = (
                "a SQLite database of something else"
                if head == _SQLITE_HEADER
                else "not a SQLite database"
            )
            raise StoreError(
                f"{self.path} is {what}, not a backchannel store (left as it is); name a "
                "new file, or the database file of a hub"
            )
        try:
            if stat.S_IMODE(self.path.stat().st_mode) != 0o600:
                self.path.chmod(0o600)
            # beside the file itself, where SQLite keeps them when the path is a link
            real = os.path.realpath(self.path)
            for suffix in ("-wal", "-shm", "-journal"):
                _private_companion(Path(f"{real}{suffix}"), suffix)
        except OSError as exc:
            raise StoreError(
                f"cannot make SQLite store {self.path} private: {exc}; check that it "
                "belongs to the user the hub runs as"
            ) from exc

    def _migrate(self) -> None:
        conn = _connect(self.path)
        try:
            migrate(conn, self.path)
            row = conn.execute("SELECT store_id FROM store_identity").fetchone()
            st = os.stat(self.path)
        finally:
            conn.close()
        if row is None:  # the row removed by hand: the store is no longer told apart
            raise StoreError(
                f"the SQLite store {self.path} has lost its identity (the table "
                "store_identity is empty); put the row back from a backup of this file"
            )
        # the file's device and inode too: a copy of the file is another store
        self.identity = f"sqlite:{row[0]}:{st.st_dev}:{st.st_ino}"

    async def close(self) -> None:
        if self._closed or self._writer is None:
            self._closed = True
            return
        self._closed = True
        self._jobs.put(None)
        self._reads.put(None)
        await asyncio.to_thread(self._writer.join)
        if self._reader is not None:
            await asyncio.to_thread(self._reader.join)

    def transact(self, fn: Callable[[Tx], T]) -> asyncio.Future[T]:
        return self._submit(self._jobs, fn)

    def transact_each(
        self, fns: Sequence[Callable[[Tx], T]]
    ) -> asyncio.Future[list[T | Exception]]:
        """One future for all of ``fns``: each is a job of its own to the writer (a
        failing one is undone alone, as a failing ``transact`` is), and the event loop
        is handed the answers together."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[T | Exception]] = loop.create_future()
        if not fns:
            fut.set_result([])
        elif self._closed or self._writer is None:
            fut.set_exception(StoreError("the SQLite store is not open"))
        else:
            group = _Group(fut, fns)
            put = self._jobs.put
            for index, fn in enumerate(fns):
                put(_Job(fn, loop, fut, group, index))
        return fut

    def read(self, fn: Callable[[Tx], T]) -> asyncio.Future[T]:
        return self._submit(self._reads, fn)

    def _submit(
        self, q: queue.SimpleQueue[_Job | None], fn: Callable[[Tx], T]
    ) -> asyncio.Future[T]:
        """The job's future, which the thread resolves (no coroutine around it)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        if self._closed or self._writer is None:
            fut.set_exception(StoreError("the SQLite store is not open"))
        else:
            q.put(_Job(fn, loop, fut))
        return fut

    # -- threads -----------------------------------------------------------
    def _answer(self, results: list[tuple[_Job, Any, BaseException | None]]) -> None:
        """Hand results to their event loops. A loop is woken (a write to its self-pipe,
        a system call) only when no hand-over to it is pending already; results that
        come while one is pending ride along with it."""
        wake: list[asyncio.AbstractEventLoop] = []
        with self._answers_lock:
            for item in results:
                loop = item[0].loop
                pending = self._answers.get(loop)
                if pending is None:
                    self._answers[loop] = [item]
                    wake.append(loop)
                else:
                    pending.append(item)
        for loop in wake:
            try:
                loop.call_soon_threadsafe(self._hand_over, loop)
            except RuntimeError:  # a closed loop: nobody is waiting any more
                with self._answers_lock:
                    self._answers.pop(loop, None)

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._answers_lock:
            items = self._answers.pop(loop, [])
        _resolve_all(items)

    def _write_loop(self) -> None:
        conn = self._connection()
        tx = SqliteTx(conn)
        self._log = wal = _Log(conn, self.path)
        last_version = conn.execute("PRAGMA data_version").fetchone()[0]
        try:
            while True:
                try:
                    first = self._jobs.get(timeout=0.25)
                except queue.Empty:
                    version = conn.execute("PRAGMA data_version").fetchone()[0]
                    if version != last_version:
                        last_version = version
                        self._external_change()
                    wal.idle()
                    continue
                if first is None:
                    return
                batch = [first]
                stop = False
                while len(batch) < self._max_batch:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:
                        stop = True
                        break
                    batch.append(job)
                self._run_batch(conn, tx, batch)
                wal.after_batch()
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                if version != last_version:
                    last_version = version
                    self._external_change()
                if stop:
                    return
        finally:
            conn.close()

    def _run_batch(self, conn: sqlite3.Connection, tx: SqliteTx, batch: list[_Job]) -> None:
        """One transaction for the whole batch. Optimistically the jobs run back to back;
        if one raises, the batch is rolled back and run again with a savepoint per job,
        so the failing job is undone alone (jobs may be re-run: see the Store contract)."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            moved = self._moved_on(conn)
            if moved is not None:
                conn.execute("ROLLBACK")
                self._answer([(job, None, moved) for job in batch])
                return
            tx.begin_write()
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            self._log.failed(exc)
            err = _translate(exc, self.path, "is unavailable")
            self._answer([(job, None, err) for job in batch])
            return
        results: list[tuple[_Job, Any, BaseException | None]] = []
        try:
            for job in batch:
                results.append((job, job.fn(tx), None))
            tx.flush()
        except BaseException:
            conn.execute("ROLLBACK")
            tx.forget()
            retried = self._run_one_by_one(conn, tx, batch)
            if retried is None:
                return
            results = retried
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            tx.forget()
            self._log.failed(exc)
            failed = _translate(exc, self.path)
            results = [(job, None, failed if e is None else e) for job, _, e in results]
        self._answer(results)

    def _run_one_by_one(
        self, conn: sqlite3.Connection, tx: SqliteTx, batch: list[_Job]
    ) -> list[tuple[_Job, Any, BaseException | None]] | None:
        tx.forget()
        try:
            conn.execute("BEGIN IMMEDIATE")
            moved = self._moved_on(conn)
            if moved is not None:
                conn.execute("ROLLBACK")
                self._answer([(job, None, moved) for job in batch])
                return None
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            self._log.failed(exc)
            err = _translate(exc, self.path, "is unavailable")
            self._answer([(job, None, err) for job in batch])
            return None
        results: list[tuple[_Job, Any, BaseException | None]] = []
        for job in batch:
            conn.execute("SAVEPOINT job")
            try:
                value = job.fn(tx)
                tx.flush()
            except BaseException as exc:
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
                tx.forget()
                if isinstance(exc, sqlite3.Error):
                    self._log.failed(exc)
                    exc = _translate(exc, self.path, conn=conn)
                results.append((job, None, exc))
            else:
                conn.execute("RELEASE job")
                results.append((job, value, None))
        return results

    def _moved_on(self, conn: sqlite3.Connection) -> StoreError | None:
        """Inside a write transaction: the error to answer if a newer backchannel has
        migrated the file since (a rolling upgrade with this hub still running), else
        ``None``. SQLite's schema cookie changes with every change of the schema, and
        reading it costs no I/O beyond what the transaction reads anyway; only when it
        moved is ``schema_migrations`` read."""
        cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
        if cookie == self._schema_cookie:
            return None
        version = _schema_version(conn)
        if version is not None and version > SCHEMA_VERSION:
            return StoreError(schema_moved_on(f"SQLite file {self.path}", version))
        self._schema_cookie = cookie
        return None

    def _read_loop(self) -> None:
        conn = self._connection()
        tx = SqliteTx(conn)
        try:
            while True:
                job = self._reads.get()
                if job is None:
                    return
                tx.forget()
                try:
                    conn.execute("BEGIN")
                    try:
                        value = job.fn(tx)
                    finally:
                        conn.execute("ROLLBACK")
                except BaseException as exc:
                    if isinstance(exc, sqlite3.Error):
                        exc = _translate(exc, self.path, conn=conn)
                    self._answer([(job, None, exc)])
                else:
                    self._answer([(job, value, None)])
        finally:
            conn.close()

    def _external_change(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._emit_change, None, None)


class _Log:
    """The writer's care of the write-ahead log, so that it neither keeps the size a
    burst gave it nor fills a small disk by itself.

    * SQLite's automatic checkpoint (after a commit that leaves 1000 pages of log) is
      lowered to a quarter of the disk's free space, so the log and the pages its
      checkpoint adds to the database file fit in the room there is. The free space is
      looked at once a second, after every batch while it is short (one ``statvfs``).
    * When the writer idles with a log larger than that, or after a write failed on a
      full disk, it checkpoints and truncates the log (``wal_checkpoint(TRUNCATE)``,
      without waiting for readers); a checkpoint the disk has no room for (it moves the
      log's pages into the database file, which may grow) is tried again every
      ``_RETRY_CHECKPOINT`` seconds until space is freed and it is done.

    Nothing of this runs a statement in a batch that went well, except when a lowered
    checkpoint size must change."""

    __slots__ = (
        "conn",
        "folder",
        "full",
        "look_at",
        "page_size",
        "pages",
        "retry_at",
        "short",
        "wal",
    )

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.wal = f"{path}-wal"
        self.folder = path.parent
        self.page_size: int = conn.execute("PRAGMA page_size").fetchone()[0]
        self.pages = _CHECKPOINT_PAGES
        self.look_at = 0.0  # when to look at the disk's free space again
        self.short = False  # the disk has little room: look after every batch
        self.full = False  # a write failed on a full disk: checkpoint when there is room
        self.retry_at = 0.0

    def failed(self, exc: sqlite3.Error) -> None:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL:
            self.full = True

    def after_batch(self) -> None:
        now = time.monotonic()
        if self.short or now >= self.look_at:
            self._mind_room(now)
        if self.full and now >= self.retry_at:
            self._truncate(now)

    def idle(self) -> None:
        now = time.monotonic()
        if not self.full:
            try:
                size = os.stat(self.wal).st_size
            except OSError:
                return
            if size <= min(JOURNAL_SIZE_LIMIT, self.pages * self.page_size):
                return
        elif now < self.retry_at:
            return
        self._mind_room(now)
        self._truncate(now)

    def _mind_room(self, now: float) -> None:
        self.look_at = now + _ROOM_EVERY
        try:
            st = os.statvfs(self.folder)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        self.short = free < _LITTLE_ROOM
        pages = max(_FEWEST_CHECKPOINT_PAGES, min(_CHECKPOINT_PAGES, free // (4 * self.page_size)))
        if pages != self.pages:
            try:
                self.conn.execute(f"PRAGMA wal_autocheckpoint = {pages}")
            except sqlite3.Error:
                return
            self.pages = pages

    def _truncate(self, now: float) -> None:
        """Checkpoint the whole log and truncate it to nothing, unless a reader (of
        this process or another) still needs its pages: then it is left for later."""
        self.retry_at = now + _RETRY_CHECKPOINT
        conn = self.conn
        try:
            conn.execute("PRAGMA busy_timeout = 0")
            try:
                busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            finally:
                conn.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")
        except sqlite3.Error as exc:
            log.debug("checkpoint of %s not done: %s", self.wal, exc)
            return
        if not busy:
            self.full = False


def _schema_version(conn: sqlite3.Connection) -> int | None:
    """The file's schema version as ``schema_migrations`` records it (0: none), or
    ``None`` if it cannot be read."""
    try:
        row = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    except sqlite3.OperationalError as exc:
        return 0 if str(exc).startswith("no such table") else None
    except sqlite3.Error:
        return None
    return int(row[0] or 0)


def _foreign(path: Path) -> bool:
    """Whether the SQLite database at ``path`` holds tables but not the hub's schema."""
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
        try:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        finally:
            conn.close()
    except sqlite3.Error:
        return False  # what it is, SQLite says when it opens it
    return bool(names) and "schema_migrations" not in names


#: What SQLite's primary error codes mean for the person running the hub, and what to
#: do; any other code is a transient failure, retried by whoever sent the request.
_WAY_OUT = {
    sqlite3.SQLITE_FULL: "the disk holding it is full: free space there (the hub goes on "
    "by itself once there is room), then retry",
    sqlite3.SQLITE_IOERR: "reading or writing its file failed: check the disk and the "
    "system log, then retry",
    sqlite3.SQLITE_READONLY: "it cannot be written: give the user the hub runs as write "
    "access to the file and its directory, then restart the hub",
    sqlite3.SQLITE_CORRUPT: "the file is damaged: stop the hub and restore it from a "
    "backup (or recover it with `sqlite3 FILE .recover`)",
    sqlite3.SQLITE_NOTADB: "the file is damaged: stop the hub and restore it from a "
    "backup (or recover it with `sqlite3 FILE .recover`)",
}


def _translate(
    exc: sqlite3.Error,
    path: Path,
    what: str = "failed",
    *,
    conn: sqlite3.Connection | None = None,
) -> BackchannelError:
    """The hub's error for SQLite's: nothing of the failed request was stored, and the
    message says why and what to do (not "retry shortly" for a full disk). A table or
    column missing on a file whose schema is older than this code's (put back under the
    running hub) says so, if ``conn`` (outside any failed transaction) can tell."""
    if isinstance(exc, sqlite3.IntegrityError):
        return AlreadyExists(f"duplicate key: {exc}")
    if conn is not None and str(exc).startswith(("no such table", "no such column")):
        version = _schema_version(conn)
        if version is not None and version < SCHEMA_VERSION:
            return StoreError(schema_put_back(f"SQLite file {path}", version))
    way_out = _WAY_OUT.get(getattr(exc, "sqlite_errorcode", 0) & 0xFF, "retry shortly")
    return StoreError(f"SQLite store {path} {what}: {exc}; nothing was stored; {way_out}")


def _private_companion(path: Path, suffix: str) -> None:
    """Narrow the store's ``suffix`` file at ``path`` (if there is one) to 0600, through
    a descriptor opened without following a link: a link there (to a file of the user's
    elsewhere) is refused, naming it, rather than its target narrowed and then written
    to by SQLite."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        try:
            target = f" (to {os.readlink(path)})"
        except OSError:
            target = ""
        raise StoreError(
            f"{path} is a symbolic link{target}: the store keeps its {suffix} file there "
            "itself and never writes through a link; remove the link (with no hub running "
            "on the store) and start again"
        ) from None
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
