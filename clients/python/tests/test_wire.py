"""The SDK's models against the service's wire contract: `docs/openapi.json`, the OpenAPI
document generated from `farm serve`'s own types (a Rust test keeps the file equal to them).

Each model accounts for every property of its answer's schema (a field it reads, or one it
leaves in `raw` on purpose), reads nothing the schema lacks, and reads each with a type the
schema allows. A field added to, renamed in or dropped from a server type fails here until
the model follows.
"""

import dataclasses
import json
import typing
from pathlib import Path

import pytest

from farm_sdk import _calls, _hosting, _pty
from farm_sdk.hosting_models import OutputChunk, Port, ProcessInfo
from farm_sdk.models import Context, EntryInfo, Environment, ExecResult, FolderListing, ResetInfo, SandboxInfo

DOCUMENT = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"

#: model -> (its schema, {model field: the property it reads}, properties left in `raw`).
MODELS = {
    Environment: ("EnvironmentView", {}, {"spec"}),
    SandboxInfo: ("SandboxView", {}, set()),
    ResetInfo: ("SandboxReset", {}, set()),
    ExecResult: ("CommandOutput", {}, set()),
    Context: ("Uploaded", {"id": "context"}, set()),
    ProcessInfo: ("ProcessView", {}, set()),
    OutputChunk: ("OutputChunk", {}, set()),
    Port: ("PortView", {}, set()),
    EntryInfo: ("EntryView", {}, set()),
    FolderListing: ("FolderListing", {}, set()),
}
#: Fields a model has of its own, not read from the answer (said in its docstring).
CLIENT_FIELDS = {OutputChunk: {"stream"}}

#: JSON Schema types a Python annotation may read.
PYTHON_TYPES = {
    str: {"string"},
    int: {"integer"},
    bool: {"boolean"},
    float: {"number", "integer"},
    dict: {"object"},
    list: {"array"},
}


@pytest.fixture(scope="module")
def schemas():
    return json.loads(DOCUMENT.read_text())["components"]["schemas"]


def schema_types(prop, schemas=None):
    """The JSON types a property may hold (`null` for an optional one); a reference to another
    schema holds what that one does (an object, or e.g. an enum's string)."""
    if "$ref" in prop:
        named = (schemas or {}).get(prop["$ref"].rsplit("/", 1)[-1])
        return schema_types(named, schemas) if named is not None else {"object"}
    kinds = prop.get("type", [])
    kinds = set([kinds] if isinstance(kinds, str) else kinds)
    for alternative in prop.get("oneOf", []) + prop.get("anyOf", []):
        kinds |= schema_types(alternative, schemas)
    return kinds or {"object", "string", "integer", "number", "boolean", "array", "null"}


def python_types(annotation):
    """The JSON types a model field's annotation accepts."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        return set().union(*(python_types(a) for a in typing.get_args(annotation)))
    if annotation is type(None):
        return {"null"}
    if annotation is typing.Any:
        return {"object", "string", "integer", "number", "boolean", "array", "null"}
    base = origin or annotation
    return PYTHON_TYPES.get(base, {"object"})


@pytest.mark.parametrize("model", list(MODELS), ids=lambda m: m.__name__)
def test_a_model_reads_what_its_answer_holds(model, schemas):
    name, renamed, left_in_raw = MODELS[model]
    schema = schemas[name]
    props = schema["properties"]
    hints = typing.get_type_hints(model)
    read = set()
    for f in dataclasses.fields(model):
        if f.name in ("raw", "_api") or f.name in CLIENT_FIELDS.get(model, ()):
            continue
        prop = renamed.get(f.name, f.name)
        assert prop in props, f"{model.__name__}.{f.name} reads {prop!r}, which {name} does not have"
        allowed = python_types(hints[f.name])
        served = schema_types(props[prop], schemas) - {"null"}
        assert served & allowed, f"{model.__name__}.{f.name} reads {prop!r} as {allowed}; the service sends {served}"
        read.add(prop)
    unaccounted = set(props) - read - left_in_raw
    assert not unaccounted, f"{name} has {sorted(unaccounted)}, which {model.__name__} neither reads nor leaves in raw"


def test_a_log_page_and_requests_name_what_the_service_takes(schemas):
    page = schemas["LogPage"]["properties"]
    assert {"lines", "next", "state"} <= set(page), page
    # The bodies the SDK builds, with every option given, name only fields the service's
    # request types have.
    environment = _calls.create_environment(
        {"image": "python"}, _calls.environment_options(2, 1024, 2048, ["true"], True)
    )
    assert set(environment.json) <= set(schemas["EnvironmentRequest"]["properties"]), environment.json
    dockerfile = _calls.dockerfile_spec("ctx-1", "Dockerfile", {"A": "b"}, "final")
    assert set(dockerfile) <= set(schemas["DockerfileRequest"]["properties"]), dockerfile
    options = _calls.sandbox_options({"A": "b"}, "/w", "u", "net", 64, 60, 600, 1, 512, {"k": "v"})
    sandbox = _calls.create_sandbox("env-1", options)
    assert set(sandbox.json) <= set(schemas["SandboxRequest"]["properties"]), sandbox.json
    for command in ("echo hi", ["echo", "hi"]):
        call = _calls.exec_call("sb-1", command, "/", {"A": "b"}, "u", 5, "in", 1024, stream=False)
        assert set(call.json) <= set(schemas["SandboxExecRequest"]["properties"]), call.json


def test_the_hosting_requests_name_what_the_service_takes(schemas):
    """The bodies of processes, ports, timers and branches, with every option given."""
    start = _hosting.start_call("sb-1", "top", "/", {"A": "b"}, "u", 4096, (24, 80))
    assert set(start.json) <= set(schemas["ProcessStart"]["properties"]), start.json
    assert set(start.json["pty"]) == set(schemas["PtySize"]["required"])
    argv = _hosting.start_call("sb-1", ["ls", "-l"], None, None, None, None, None)
    assert set(argv.json) <= set(schemas["ProcessStart"]["properties"]), argv.json
    stdin = _hosting.stdin_call("sb-1", 1, "x", True)
    assert set(stdin.json) <= set(schemas["StdinWrite"]["properties"]), stdin.json
    signal = _hosting.signal_call("sb-1", 1, 9)
    assert set(signal.json) == set(schemas["SignalSend"]["required"])
    signal_schema = schemas[schemas["SignalSend"]["properties"]["signal"]["$ref"].rsplit("/", 1)[1]]
    assert {"type": "string"} in signal_schema["oneOf"] and signal.json["signal"] == "9"
    assert set(_hosting.timeout_body(1, 2, 3)) <= set(schemas["TimeoutRequest"]["properties"])
    assert {"port"} == set(schemas["PortOpen"]["properties"])
    assert {"count"} == set(schemas["BranchRequest"]["properties"])
    resize = json.loads(_pty.resize_message(1, 2))
    resize_schema = next(s for s in schemas["PtyControl"]["oneOf"] if s["properties"]["type"].get("enum") == ["resize"])
    assert set(resize) == set(resize_schema["required"])


def _query(document, path, method="get"):
    return {p["name"] for p in document["paths"][path][method].get("parameters", []) if p["in"] == "query"}


def test_the_queries_the_sdk_sends_are_the_services():
    document = json.loads(DOCUMENT.read_text())
    processes = "/v1/sandboxes/{id}/processes/{pid}"
    output = _hosting.output_call("sb-1", 1, "stdout", 0, 10, 5)
    assert set(output.params) <= _query(document, processes + "/output")
    follow = _hosting.follow_call("sb-1", 1, 0, 0)
    assert set(follow.params) <= _query(document, processes + "/output/stream")
    assert set(_hosting.wait_call("sb-1", 1, 5).params) <= _query(document, processes + "/wait", "post")
    listed = _hosting.list_sandboxes_call("running", {"k": "v"})
    names = {"metadata.KEY" if k.startswith("metadata.") else k for k in listed.params}
    assert names <= _query(document, "/v1/sandboxes")
    url, _, _ = _pty.address("http://h", {}, "sb-1", 24, 80, "sh", "/", "u", None, None, True)
    attach, _, _ = _pty.address("http://h", {}, "sb-1", 24, 80, None, None, None, 7, 0, False)
    names = {part.split("=")[0] for u in (url, attach) for part in u.split("?")[1].split("&")}
    assert names <= _query(document, "/v1/sandboxes/{id}/pty")
