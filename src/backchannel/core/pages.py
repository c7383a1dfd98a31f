"""How long a page of a list the hub answers is (sessions, links, delegations, ...).

Every list is answered a bounded page at a time, in a stable order, with the cursor of
the next page (``next_after``: the key of the page's last item, None on the last page):
a team's lists grow without bound (a team may open ten thousand sessions), and one
answer holding all of them is a body no client should have to take in at once.
"""

from __future__ import annotations

#: How many items a list answers when no ``limit`` is given.
PAGE = 100
#: The most a list answers at once; the rest are read page by page, ``after`` the last
#: item of the page before.
MAX_PAGE = 1000
