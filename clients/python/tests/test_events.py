"""Lifecycle events, webhooks, usage and resumes that check, in both faces, against a
scripted service."""

import asyncio
import json

import httpx
import pytest

from farm_sdk import AsyncFarm, Conflict, Farm, FarmError
from farm_sdk._events import EventFollow
from mock_farm import SANDBOX, MockFarm, body, error


def event(i, kind="created", sandbox="sb-1"):
    return {"id": i, "at_ms": 1000 + i, "tenant": "default", "sandbox": sandbox, "kind": "sandbox",
            "type": kind, "state": "running"}


def stream(*events, tail=""):
    text = "".join(f"id: {e['id']}\nevent: event\ndata: {json.dumps(e)}\n\n" for e in events) + tail
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=text.encode())


def test_events_are_listed_after_an_id_and_of_one_sandbox():
    server = MockFarm().on("GET", "/v1/events", httpx.Response(200, json={"events": [event(3)], "next_after": 3}))
    farm = Farm(transport=server.transport())
    assert farm.events(after=2, sandbox="sb-1", limit=10)["next_after"] == 3
    params = server.requests[0].url.params
    assert (params["after"], params["sandbox"], params["limit"]) == ("2", "sb-1", "10")


def test_a_follower_reads_events_as_they_come_and_keeps_the_last_id():
    follow = EventFollow("GET", "/v1/events/stream", after=4)
    text = f"id: 5\nevent: event\ndata: {json.dumps(event(5))}\n\n: keep-alive\n\nid: 6\nevent: ev"
    assert [e["id"] for e in follow.feed(text)] == [5]
    assert [e["id"] for e in follow.feed(f"ent\ndata: {json.dumps(event(6))}\n\n")] == [6]
    assert follow.last_id == 6 and not follow.ended
    follow.feed('event: error\ndata: {"error": "the key was revoked"}\n\n')
    with pytest.raises(FarmError, match="revoked"):
        follow.finish()


def test_follow_events_yields_the_streams_events_in_both_faces():
    server = MockFarm().on("GET", "/v1/events/stream", stream(event(1), event(2, "paused")))
    farm = Farm(transport=server.transport())
    assert [e["type"] for e in farm.follow_events(after=0)] == ["created", "paused"]
    assert server.requests[0].url.params["after"] == "0"

    async def both():
        server = MockFarm().on("GET", "/v1/events/stream", stream(event(7)))
        async with AsyncFarm(transport=server.transport()) as farm:
            return [e["id"] async for e in farm.follow_events()]

    assert asyncio.run(both()) == [7]


def test_a_resume_names_what_it_must_find_and_its_refusal_says_what_is_missing():
    missing = error(409, "sandbox sb-1 failed its resume checks: nothing listens on port 8000")
    server = (
        MockFarm()
        .on("GET", "/v1/sandboxes/sb-1", httpx.Response(200, json=SANDBOX))
        .on("POST", "/v1/sandboxes/sb-1/resume", httpx.Response(200, json=SANDBOX), missing)
    )
    farm = Farm(transport=server.transport())
    sandbox = farm.sandboxes.get("sb-1")
    assert sandbox.resume().state == "running"
    assert body(server.requests[-1]) == {}
    with pytest.raises(Conflict, match="port 8000"):
        sandbox.resume(keep={"ports": [8000], "files": [{"path": "/w/out", "size": 3}]})
    assert body(server.requests[-1]) == {"keep": {"ports": [8000], "files": [{"path": "/w/out", "size": 3}]}}


def test_a_create_carries_keep_and_on_timeout():
    server = MockFarm().on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
    farm = Farm(transport=server.transport())
    farm.sandboxes.create("env-1", on_timeout="pause", keep={"processes": [42]})
    sent = body(server.requests[0])
    assert (sent["on_timeout"], sent["keep"]) == ("pause", {"processes": [42]})


def test_metrics_and_webhooks():
    metrics = {"sandbox": "sb-1", "state": "running", "now": {"cpu_seconds": 1.5}, "life": {"cpu_seconds": 2.0}}
    hook = {"id": "wh-1", "url": "http://hooks.test/x", "created_at_ms": 1, "delivered": 0, "failures": 0,
            "secret": "ab" * 32}
    server = (
        MockFarm()
        .on("GET", "/v1/sandboxes/sb-1", httpx.Response(200, json=SANDBOX))
        .on("GET", "/v1/sandboxes/sb-1/metrics", httpx.Response(200, json=metrics))
        .on("POST", "/v1/webhooks", httpx.Response(201, json=hook))
        .on("GET", "/v1/webhooks", httpx.Response(200, json={"webhooks": [dict(hook, secret=None)]}))
        .on("DELETE", "/v1/webhooks/wh-1", httpx.Response(200, json={"id": "wh-1", "deleted": True}))
    )
    farm = Farm(transport=server.transport())
    assert farm.sandboxes.get("sb-1").metrics()["life"]["cpu_seconds"] == 2.0
    assert farm.add_webhook("http://hooks.test/x")["secret"] == "ab" * 32
    assert [h["id"] for h in farm.webhooks()] == ["wh-1"]
    farm.delete_webhook("wh-1")
    assert server.requests[-1].method == "DELETE"


def test_workspaces_are_made_mounted_synced_and_fenced():
    ws = {"name": "data", "id": "ws-1", "size_mib": 8, "bytes": 0, "generation": 0, "holder": None,
          "created_at_ms": 1, "synced_at_ms": None, "keep_days": None}
    server = (
        MockFarm()
        .on("POST", "/v1/workspaces", httpx.Response(201, json=ws))
        .on("POST", "/v1/sandboxes", httpx.Response(201, json=SANDBOX))
        .on("POST", "/v1/sandboxes/sb-1/workspaces/sync", httpx.Response(200, json={"workspaces": [dict(ws, generation=1)]}),
            error(409, "workspace \"data\" was taken from this sandbox (generation 1 is fenced)"))
        .on("POST", "/v1/workspaces/data/fence", httpx.Response(200, json=ws))
    )
    farm = Farm(transport=server.transport())
    assert farm.workspaces.create("data", 8)["id"] == "ws-1"
    assert body(server.requests[0]) == {"name": "data", "size_mib": 8}
    sandbox = farm.sandboxes.create("env-1", workspaces=[{"name": "data", "path": "/w"}])
    assert body(server.requests[1])["workspaces"] == [{"name": "data", "path": "/w"}]
    assert sandbox.sync_workspaces()[0]["generation"] == 1
    farm.workspaces.fence("data")
    with pytest.raises(Conflict, match="fenced"):
        sandbox.sync_workspaces()
