#!/usr/bin/env python3
"""A TCP proxy on the loopback interface that holds every HTTP request DELAY seconds before
passing it on: a slow bucket in front of a local S3 server, for `just bench-remote`.

    python3 .ci/slow_proxy.py LISTEN_PORT UPSTREAM_PORT DELAY_S
"""
import asyncio
import sys

METHODS = (b"GET ", b"PUT ", b"HEAD ", b"POST ", b"DELETE ")


async def pipe(reader, writer, delay):
    try:
        while data := await reader.read(65536):
            if delay and data.startswith(METHODS):
                await asyncio.sleep(delay)  # a new request on this connection
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main(listen, upstream, delay):
    async def handle(cr, cw):
        ur, uw = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(pipe(cr, uw, delay), pipe(ur, cw, 0))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
