"""TensorBoard that opens on the values as logged: `make tensorboard`, or

    python -m fasttrain.tools.board --logdir logs --host 127.0.0.1 --port 6006

(any of tensorboard's own flags). TensorBoard smooths every curve by 0.6 until the user moves
the slider, and neither an event file nor a server flag can change that (the setting lives in
the browser's local storage): a curve of 3-15 validation points then reads wrong (a language
model's validation perplexity of 12.6 shows as 19). So a visit to the bare address is sent on
to `/?smoothing=0`, the link state TensorBoard itself reads and writes (no #fragment in it: a
browser keeps the one asked for, so `/#hparams` still opens HPARAMS); every other address, a
link with a state of its own included, is TensorBoard's, unchanged.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

LANDING = "?smoothing=0"

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def unsmoothed_landing(app: Wsgi, path_prefix: str = "") -> Wsgi:
    """`app` with a request for the bare address (no path below the prefix, no query)
    redirected to LANDING."""
    bare = {path_prefix.rstrip("/") + "/", path_prefix.rstrip("/")}

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") in bare and not environ.get("QUERY_STRING"):
            location = path_prefix.rstrip("/") + "/" + LANDING
            start_response("302 Found", [("Location", location), ("Content-Length", "0")])
            return [b""]
        return app(environ, start_response)

    return serve


def _server(app: Wsgi, flags: Any) -> Any:
    """TensorBoard's own port-scanning server around the redirecting app."""
    from tensorboard import program

    return program.create_port_scanning_werkzeug_server(
        unsmoothed_landing(app, flags.path_prefix or ""), flags
    )


def main(argv: list[str] | None = None) -> int:
    from tensorboard import program

    board = program.TensorBoard(server_class=_server)
    board.configure(argv=["tensorboard", *(sys.argv[1:] if argv is None else argv)])
    return int(board.main())


if __name__ == "__main__":
    sys.exit(main())
