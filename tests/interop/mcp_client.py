"""Drives agent-bridge with the official MCP Python SDK, unmodified, and prints what it saw as JSON.

usage: mcp_client.py AGENT_BRIDGE RECIPIENT
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(bridge: str, recipient: str) -> None:
    params = StdioServerParameters(
        command=bridge,
        args=["mcp", "--harness", "other", "--handle", "py"],
        env=dict(os.environ),
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            sent = await session.call_tool("relay_send", {"to": recipient, "body": "hello from the python sdk"})
            refused = await session.call_tool("relay_send", {"to": "nobody-here", "body": "x"})
            # The SDK checks every structuredContent against the tool's outputSchema.
            me = await session.call_tool("relay_whoami", {})
            asked = await session.call_tool("relay_ask", {"to": recipient, "body": "which port?", "wait_s": 20})
            board = await session.call_tool("list_jobs", {})
            print(
                json.dumps(
                    {
                        "protocol": init.protocolVersion,
                        "server": init.serverInfo.name,
                        "tools": [t.name for t in tools.tools],
                        "sent_error": sent.isError,
                        "sent": sent.structuredContent,
                        "refused_error": refused.isError,
                        "refused_text": refused.content[0].text,
                        "me": me.structuredContent,
                        "asked_error": asked.isError,
                        "asked": asked.structuredContent,
                        "asked_text": asked.content[0].text,
                        "board_error": board.isError,
                        "annotations": {t.name: t.annotations.model_dump() if t.annotations else None for t in tools.tools},
                        "output_schemas": [t.name for t in tools.tools if t.outputSchema],
                    }
                )
            )


asyncio.run(main(sys.argv[1], sys.argv[2]))
