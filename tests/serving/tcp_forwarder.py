"""A TCP forwarder process: the stand-in for an upstream's network endpoint.

``python -m tests.serving.tcp_forwarder LISTEN_PORT TARGET_PORT`` listens on
127.0.0.1:LISTEN_PORT and pipes every connection to 127.0.0.1:TARGET_PORT.
SIGKILL of this process does to its clients what SIGKILL of the upstream
server does: the kernel closes every connection mid-response and the port
refuses new ones. Starting it again on the same port brings the upstream back
in a fraction of a second, where a new vLLM server takes half a minute, so
the upstream-death test can run against the session's one vLLM server.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _forward(target_port: int, client_r: asyncio.StreamReader,
                   client_w: asyncio.StreamWriter) -> None:
    try:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", target_port)
    except OSError:
        client_w.close()
        return
    await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))


async def main(listen_port: int, target_port: int) -> None:
    server = await asyncio.start_server(
        lambda r, w: _forward(target_port, r, w), "127.0.0.1", listen_port,
        reuse_address=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
