"""A client generated from the served OpenAPI document gets a typed model for every
``/v1`` answer: no operation answers an untyped object or an empty schema."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from backchannel.hub import Hub
from backchannel.interfaces.http import create_app
from backchannel.stores.memory import MemoryStore

CODEGEN = Path(sys.executable).parent / "datamodel-codegen"


async def _served_document() -> dict[str, Any]:
    app = create_app(Hub(MemoryStore()), "admin-token")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://hub") as http:
        doc: dict[str, Any] = (await http.get("/openapi.json")).json()
    return doc


def _answers(doc: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    out = []
    for path, ops in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, op in ops.items():
            for status, response in op["responses"].items():
                for media, body in response.get("content", {}).items():
                    out.append((f"{method.upper()} {path}", status, media, body.get("schema", {})))
    return out


async def test_every_v1_answer_has_a_named_model_with_fields() -> None:
    doc = await _served_document()
    schemas = doc["components"]["schemas"]
    found = _answers(doc)
    assert len({op for op, *_ in found}) >= 45
    for op, status, media, schema in found:
        if media == "text/event-stream":
            assert schema.get("type") == "object", (op, schema)
            continue
        assert media == "application/json", (op, status, media)
        ref = schema.get("$ref", "")
        assert ref.startswith("#/components/schemas/"), (op, status, schema)
        target = schemas[ref.rsplit("/", 1)[1]]
        assert target.get("type") == "object" and target.get("properties"), (op, status, ref)


async def test_a_generated_client_has_typed_models_for_every_v1_answer(tmp_path: Path) -> None:
    if not CODEGEN.exists():
        pytest.skip("datamodel-code-generator is not installed (the dev extra has it)")
    doc = await _served_document()
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(doc))
    out = tmp_path / "generated.py"
    await asyncio.to_thread(
        subprocess.run,
        [
            str(CODEGEN),
            "--input", str(spec),
            "--input-file-type", "openapi",
            "--output", str(out),
            "--output-model-type", "pydantic_v2.BaseModel",
            "--disable-timestamp",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    loaded = importlib.util.spec_from_file_location("generated_models", out)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    sys.modules["generated_models"] = module
    try:
        loaded.loader.exec_module(module)
    finally:
        sys.modules.pop("generated_models", None)
    for op, status, media, schema in _answers(doc):
        if media != "application/json":
            continue
        name = schema["$ref"].rsplit("/", 1)[1]
        model = getattr(module, name, None)
        assert isinstance(model, type) and issubclass(model, BaseModel), (op, status, name)
        fields = model.model_fields
        assert fields, (op, status, name)
        for field, info in fields.items():
            assert info.annotation is not Any, (op, name, field)
            assert str(info.annotation) != "dict[str, Any]", (op, name, field)


async def test_every_error_status_points_at_the_error_model() -> None:
    doc = await _served_document()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                if status.startswith("2") or not path.startswith("/v1/"):
                    continue
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path)
    send = doc["paths"]["/v1/messages"]["post"]["responses"]
    assert {"401", "403", "404", "409", "413", "422", "429", "503"} <= set(send)
