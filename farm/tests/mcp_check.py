"""MCP's own client (`mcp` from PyPI, unmodified; the streamable HTTP transport) against a
farm session: initialize, the tools, a command, a file written and read back, errors as the
protocol has them, a wrong token, and a submit.

Run by farm/tests/protocols.rs: python mcp_check.py URL TOKEN SESSION_ID, where TOKEN is the
session's own MCP token (what an agent is given), not the service's. Prints "ok: ..." lines
and exits non-zero at the first claim that does not hold.
"""

import sys

import anyio
import httpx2
from mcp import ClientSession, MCPError
from mcp.client.streamable_http import streamable_http_client

URL, TOKEN, SESSION = sys.argv[1], sys.argv[2], sys.argv[3]
ENDPOINT = f"{URL}/v1/sessions/{SESSION}/mcp"


def http(token):
    # A submit is scored in a fresh VM: room for a loaded machine.
    return httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60.0, read=600.0)
    )


def text(result):
    return "".join(c.text for c in result.content if c.type == "text")


async def wrong_token():
    try:
        async with http("wrong") as h, streamable_http_client(ENDPOINT, http_client=h) as (r, w):
            async with ClientSession(r, w) as session:
                await session.initialize()
    except BaseException as e:  # noqa: BLE001 - MCPError, or the transport's ExceptionGroup
        return repr(e)
    raise AssertionError("a wrong token initialized")


async def main():
    print(f"ok: a wrong token is refused ({(await wrong_token())[:60]}...)")
    async with http(TOKEN) as h, streamable_http_client(ENDPOINT, http_client=h) as (r, w):
        async with ClientSession(r, w) as session:
            init = await session.initialize()
            assert init.server_info.name == "farm", init
            assert SESSION in (init.instructions or ""), init.instructions
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert sorted(tools) == ["exec", "read_file", "submit", "write_file"], sorted(tools)
            assert tools["exec"].input_schema["required"] == ["command"]
            print(f"ok: initialize ({init.protocol_version}), tools {sorted(tools)}")

            res = await session.call_tool("exec", {"command": "cat n.txt; echo oops >&2"})
            assert not res.is_error and "21" in text(res) and "oops" in text(res), res
            assert res.structured_content["step"]["stdout"].strip() == "21", res.structured_content
            res = await session.call_tool("exec", {"command": "exit 4"})
            assert res.is_error and "exit code: 4" in text(res), res
            print("ok: exec gives the exit code, stdout and stderr; a failing command is a tool error")

            res = await session.call_tool("write_file", {"path": "notes/a'b.txt", "content": "it's 42\n"})
            assert not res.is_error, res
            res = await session.call_tool("read_file", {"path": "notes/a'b.txt"})
            assert not res.is_error and text(res) == "it's 42\n", res
            big = "".join(f"{i:07d}\n" for i in range(4000))  # 32000 bytes, past the 16 KiB output cap
            await session.call_tool("write_file", {"path": "big.txt", "content": big})
            res = await session.call_tool("read_file", {"path": "big.txt"})
            limit = res.structured_content["limit"]
            assert res.structured_content["cut"] is True and limit < len(big), res.structured_content
            assert text(res).startswith(big[:limit]) and "cut at" in text(res), text(res)[-200:]
            res = await session.call_tool("read_file", {"path": "/no/such/file"})
            assert res.is_error and "No such file" in text(res), res
            print("ok: write_file, read_file (a quote in the path), a missing file is a tool error")

            for name, args in [("rm", {}), ("exec", {"cmd": "ls"}), ("write_file", {"path": "x"})]:
                try:
                    await session.call_tool(name, args)
                    raise AssertionError(f"{name} {args} was accepted")
                except MCPError as e:
                    assert e.code == -32602, e
            print("ok: an unknown tool and bad arguments are JSON-RPC errors (-32602)")

            await session.call_tool("write_file", {"path": "out.txt", "content": "42"})
            res = await session.call_tool("submit", {})
            assert not res.is_error and "submitted" in text(res), res
            assert res.structured_content == {"submitted": True}, res.structured_content
            try:
                await session.call_tool("exec", {"command": "true"})
                raise AssertionError("a submitted session still ran a command")
            except MCPError as e:
                assert SESSION in e.message, e
            print("ok: submit ends the session (the verdict is not told to the agent)")


anyio.run(main)
