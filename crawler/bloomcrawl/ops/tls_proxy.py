"""A TLS terminator in front of one local TCP service: scrapyd on a worker host.

scrapyd speaks plain HTTP only (its Twisted site has no TLS option). On a
worker host it listens on 127.0.0.1, and this proxy listens on the host's
address with the host's certificate (``make certs``), passing each
connection's bytes both ways; basic auth stays scrapyd's own. It is a
process of the standard library alone (asyncio and ssl), started, recorded
and stopped by pid like every other process of the cluster, so the worker
host needs no package beyond bloomcrawl's.

``python -m bloomcrawl.ops.tls_proxy --listen ADDR:PORT --to 127.0.0.1:PORT
--cert server.crt --key server.key`` serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import ssl
import sys
from collections.abc import Sequence

logger = logging.getLogger(__name__)

CHUNK = 65536
#: seconds a client gets to finish its TLS handshake
HANDSHAKE_TIMEOUT = 10.0


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
            writer.close()


class TlsProxy:
    """Accepts TLS on ``listen`` and forwards each connection to ``target`` in plain."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int],
                 context: ssl.SSLContext) -> None:
        self.listen = listen
        self.target = target
        self.context = context

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError as exc:
            logger.warning("cannot reach %s:%d: %s", *self.target, exc)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def serve(self) -> None:
        server = await asyncio.start_server(self._handle, *self.listen, ssl=self.context,
                                            ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        logger.info("TLS on %s:%d -> %s:%d", *self.listen, *self.target)
        async with server:
            await stopped.wait()


def server_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bloomcrawl.ops.tls_proxy",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--listen", type=host_port, required=True, help="ADDR:PORT, TLS")
    parser.add_argument("--to", type=host_port, required=True, help="HOST:PORT, plain")
    parser.add_argument("--cert", required=True, help="the server's certificate (PEM)")
    parser.add_argument("--key", required=True, help="its private key (PEM)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        context = server_context(args.cert, args.key)
    except (OSError, ssl.SSLError) as exc:
        parser.error(f"--cert {args.cert} / --key {args.key}: {exc}")
    try:
        asyncio.run(TlsProxy(args.listen, args.to, context).serve())
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", *args.listen, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
