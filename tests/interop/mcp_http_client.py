"""Drives the server's /mcp endpoint with the official MCP Python SDK's Streamable HTTP client,
unmodified, and prints what it saw as JSON. The machine token comes from RELAY_TOKEN.

usage: mcp_http_client.py URL HANDLE RECIPIENT
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


async def main(url: str, handle: str, recipient: str) -> None:
    headers = {"Authorization": f"Bearer {os.environ['RELAY_TOKEN']}", "Relay-Handle": handle}
    async with streamablehttp_client(url, headers=headers) as (read, write, _session_id):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            me = await session.call_tool("relay_whoami", {})
            sent = await session.call_tool("relay_send", {"to": recipient, "body": "hello over http"})
            inbox = await session.call_tool("relay_inbox", {"wait_s": 20})
            print(
                json.dumps(
                    {
                        "protocol": init.protocolVersion,
                        "server": init.serverInfo.name,
                        "tools": [t.name for t in tools.tools],
                        "output_schemas": [t.name for t in tools.tools if t.outputSchema],
                        "me": me.structuredContent,
                        "sent_error": sent.isError,
                        "sent": sent.structuredContent,
                        "inbox_error": inbox.isError,
                        "inbox": inbox.structuredContent,
                        "inbox_text": inbox.content[0].text,
                    }
                )
            )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
