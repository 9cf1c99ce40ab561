"""The rollouts API (`Service`) and the `Fleet` of several services, against scripted ones."""

import io
import json
from typing import Dict

import httpx
import pytest

from farm_sdk import ConnectionFailed, NotFound
from farm_sdk.fleet import ARROW_STREAM, Down, Fleet, Service, lost_in_restart
from mock_farm import MockFarm, body, error

A, B = "http://a.test:8765", "http://b.test:8765"


def capacity(slots=2, in_flight=0, queued=0, sessions=0, max_sessions=8):
    return httpx.Response(200, json={"slots": slots, "in_flight": in_flight, "queued": queued, "warm": 0,
                                     "queue_limit": 10, "sessions": sessions, "max_sessions": max_sessions,
                                     "memory": {}})


def groups_for(request):
    items = body(request)["items"]
    host = request.url.host.split(".")[0]
    return httpx.Response(202, json={"groups": [
        {"group_id": f"{host}-g{i}", "task_id": item["task_id"], "suite": "s",
         "rollout_ids": [f"{host}-g{i}-r{j}" for j in range(item.get("n", 1))]}
        for i, item in enumerate(items)]})


def ndjson(*rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


class Hosts:
    """One MockFarm per host, behind one transport."""

    def __init__(self, **servers: MockFarm) -> None:
        self.servers: Dict[str, MockFarm] = servers

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(lambda request: self.servers[request.url.host.split(".")[0]].handle(request))

    def fleet(self) -> Fleet:
        fleet = Fleet([A, B + "/"], transport=self.transport())
        for service in fleet.members.values():
            service._http.sleep = lambda seconds: None
        return fleet


def service(server: MockFarm) -> Service:
    s = Service("http://a.test:8765", token="tok", transport=server.transport())
    s._http.sleep = server.sleeps.append
    return s


def test_submit_sends_its_key_and_a_retry_reuses_it():
    server = MockFarm().on("POST", "/v1/rollouts", httpx.ReadError("reset"), groups_for)
    answer = service(server).submit([{"task_id": "double", "n": 2}], key="step-1")
    assert [g["rollout_ids"] for g in answer["groups"]] == [["a-g0-r0", "a-g0-r1"]]
    assert [r.headers["Idempotency-Key"] for r in server.requests] == ["step-1", "step-1"]
    assert server.requests[0].headers["Authorization"] == "Bearer tok"
    assert body(server.requests[0]) == {"items": [{"task_id": "double", "n": 2}]}
    service(server).submit([{"task_id": "double"}])
    assert server.requests[-1].headers["Idempotency-Key"] not in ("", "step-1")


def test_results_with_a_cursor_and_a_long_poll():
    server = MockFarm().on(
        "GET", "/v1/results",
        httpx.Response(200, text=ndjson({"cursor": 4, "rollout_id": "r1"}, {"cursor": 5, "rollout_id": "r2"}),
                       headers={"farm-next-cursor": "6"}),
    )
    rows, cursor = service(server).results(cursor=4, wait=30, max_rows=2)
    assert [r["rollout_id"] for r in rows] == ["r1", "r2"] and cursor == 6
    request = server.requests[0]
    assert dict(request.url.params) == {"cursor": "4", "max": "2", "wait": "30"}
    assert request.extensions["timeout"]["read"] == 600 + 30


def test_results_arrow():
    pa = pytest.importorskip("pyarrow")
    import pyarrow.ipc

    table = pa.table({"rollout_id": ["r1", "r2"], "reward": [1.0, 0.0]})
    sink = io.BytesIO()
    with pyarrow.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    server = MockFarm().on("GET", "/v1/results", httpx.Response(200, content=sink.getvalue()))
    got = service(server).results_arrow(0)
    assert got.num_rows == 2 and got.column_names == ["rollout_id", "reward"]
    assert server.requests[0].headers["Accept"] == ARROW_STREAM


def test_the_rest_of_the_rollouts_api():
    server = (
        MockFarm()
        .on("GET", "/v1/capacity", capacity())
        .on("GET", "/v1/rollouts/r1", httpx.Response(200, json={"rollout_id": "r1", "state": "done"}))
        .on("POST", "/v1/rollouts/r1/cancel", httpx.Response(200, json={"cancelled": True}))
        .on("POST", "/v1/cancel", httpx.Response(200, json={"cancelled": 3}))
        .on("GET", "/v1/sessions", httpx.Response(200, json={"sessions": [{"session_id": "s1"}]}))
        .on("GET", "/v1/rollouts/r2", error(404, "no such rollout"))
    )
    s = service(server)
    assert s.capacity()["slots"] == 2
    assert s.rollout("r1")["state"] == "done"
    assert s.cancel("r1") is True
    assert s.cancel_below(12) == 3 and body(server.requests[-1]) == {"policy_version_below": 12}
    assert s.sessions() == [{"session_id": "s1"}]
    with pytest.raises(NotFound, match="GET /v1/rollouts/r2: 404 no such rollout"):
        s.rollout("r2")


def test_sessions_steps_are_not_resent_after_a_broken_connection():
    server = (
        MockFarm()
        .on("POST", "/v1/sessions", httpx.Response(201, json={"session_id": "s1", "rollout_id": "r1"}))
        .on("POST", "/v1/sessions/s1/exec", httpx.ReadError("reset"))
        .on("POST", "/v1/sessions/s1/branch", httpx.Response(201, json={"session_id": "s2"}))
        .on("POST", "/v1/sessions/s2/write_file", httpx.Response(200, json={"step": {}}))
        .on("POST", "/v1/sessions/s2/submit", httpx.Response(200, json={"status": "passed", "reward": 1.0}))
        .on("POST", "/v1/sessions/s1/pause", httpx.ReadError("reset"), httpx.Response(200, json={"state": "paused"}))
        .on("DELETE", "/v1/sessions/s1", httpx.Response(200, json={}))
    )
    session = service(server).open_session("double", seed=3)
    assert body(server.requests[0]) == {"task_id": "double", "seed": 3}
    with pytest.raises(ConnectionFailed):
        session.exec("cat n.txt")
    assert len(server.sent("POST", "/v1/sessions/s1/exec")) == 1
    branch = session.branch()
    assert branch.id == "s2" and branch.endpoint == session.endpoint == "http://a.test:8765"
    branch.write_file("out.txt", "42")
    assert body(server.sent("POST", "/v1/sessions/s2/write_file")[0]) == {"path": "out.txt", "content": "42"}
    assert branch.submit()["status"] == "passed"
    assert body(server.sent("POST", "/v1/sessions/s2/submit")[0]) == {}
    assert session.pause()["state"] == "paused"  # pausing twice answers the same: resent
    session.close()
    assert server.paths()[-1] == "DELETE /v1/sessions/s1"


def test_a_fleet_spreads_groups_by_free_capacity_and_a_retry_keeps_the_placement():
    a = MockFarm().on("GET", "/v1/capacity", capacity(slots=4)).on("POST", "/v1/rollouts", groups_for)
    b = MockFarm().on("GET", "/v1/capacity", capacity(slots=2)).on("POST", "/v1/rollouts", groups_for)
    fleet = Hosts(a=a, b=b).fleet()
    assert list(fleet.members) == [A, B]
    items = [{"task_id": t, "n": 2} for t in ("t0", "t1", "t2")]
    groups = fleet.submit(items, key="batch-1")
    assert [(g["task_id"], g["endpoint"]) for g in groups] == [("t0", A), ("t1", A), ("t2", B)]  # 14 vs 12 free, ties to the first
    assert [r.headers["Idempotency-Key"] for r in a.sent("POST", "/v1/rollouts")] == [f"batch-1@{A}"]
    assert [r.headers["Idempotency-Key"] for r in b.sent("POST", "/v1/rollouts")] == [f"batch-1@{B}"]
    # Capacity changes; the retry still goes where the first call went, with the same keys.
    b.on("GET", "/v1/capacity", capacity(slots=100))
    again = fleet.submit(items, key="batch-1")
    assert [g["endpoint"] for g in again] == [g["endpoint"] for g in groups]
    assert len(a.sent("GET", "/v1/capacity")) == 1
    assert [r.headers["Idempotency-Key"] for r in b.sent("POST", "/v1/rollouts")] == [f"batch-1@{B}"] * 2


def test_a_down_endpoint_gets_nothing_and_keeps_its_cursor():
    a = (
        MockFarm()
        .on("GET", "/v1/capacity", capacity())
        .on("POST", "/v1/rollouts", groups_for)
        .on("GET", "/v1/results", httpx.Response(200, text=ndjson({"rollout_id": "a-g0-r0"}), headers={"farm-next-cursor": "1"}))
    )
    b = MockFarm().on("GET", "/v1/capacity", httpx.ConnectError("refused")).on("GET", "/v1/results", httpx.ConnectError("refused"))
    fleet = Hosts(a=a, b=b).fleet()
    assert fleet.capacities() == {A: capacity().json(), B: None}
    assert len(b.requests) == 1  # a probe is not retried
    groups = fleet.submit([{"task_id": "t", "n": 1}], key="k")
    assert [g["endpoint"] for g in groups] == [A]
    rows = fleet.results(wait=0)
    assert rows == [{"rollout_id": "a-g0-r0", "endpoint": A}]
    assert fleet.cursors == {A: 1, B: 0}
    # b is back: its rows come from its own cursor.
    b.on("GET", "/v1/results", httpx.Response(200, text=ndjson({"rollout_id": "b1"}), headers={"farm-next-cursor": "1"}))
    a.on("GET", "/v1/results", httpx.Response(200, text="", headers={"farm-next-cursor": "1"}))
    assert fleet.results(wait=4) == [{"rollout_id": "b1", "endpoint": B}]
    assert dict(a.requests[-1].url.params)["wait"] == "2.0" and dict(b.requests[-1].url.params)["cursor"] == "0"
    assert fleet.cursors == {A: 1, B: 1}


def test_a_fleet_with_nothing_up_is_down():
    dead = MockFarm().on("GET", "/v1/capacity", httpx.ConnectError("refused"))
    fleet = Hosts(a=dead, b=dead).fleet()
    with pytest.raises(Down):
        fleet.submit([{"task_id": "t"}], key="k")
    with pytest.raises(Down):
        fleet.open_session("t")
    with pytest.raises(ValueError):
        Fleet([])


def test_sessions_open_where_there_is_room_and_handles_find_them():
    a = MockFarm().on("GET", "/v1/capacity", capacity(sessions=7))
    b = (
        MockFarm()
        .on("GET", "/v1/capacity", capacity(sessions=1))
        .on("POST", "/v1/sessions", httpx.Response(201, json={"session_id": "s1"}))
        .on("POST", "/v1/sessions/s1/exec", httpx.Response(200, json={"step": {"stdout": "21\n"}}))
    )
    fleet = Hosts(a=a, b=b).fleet()
    session = fleet.open_session("double")
    assert session.endpoint == B and session.handle == {"endpoint": B, "session_id": "s1"}
    again = fleet.session(json.loads(json.dumps(session.handle)))
    assert again.exec("cat n.txt")["step"]["stdout"] == "21\n"
    with pytest.raises(ValueError):
        fleet.session({"endpoint": "http://c.test", "session_id": "s1"})


def test_lost_in_restart():
    assert lost_in_restart({"status": "env_error", "error": "lost in restart"})
    assert not lost_in_restart({"status": "env_error", "error": "cancelled: by request"})
    assert not lost_in_restart({"status": "passed", "error": None})
