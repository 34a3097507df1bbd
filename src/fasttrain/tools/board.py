"""TensorBoard that opens on the values as logged: `make tensorboard`, or

    python -m fasttrain.tools.board --logdir logs --host 127.0.0.1 --port 6006

(any of tensorboard's own flags). TensorBoard smooths every curve by 0.6 until the user moves
the slider, and neither an event file nor a server flag can change that (the setting lives in
the browser's local storage): a curve of 3-15 validation points then reads wrong (a language
model's validation perplexity of 12.6 shows as 19). So a visit to the bare address gets a page
that sends it on to LANDING, the link state TensorBoard itself reads and writes: smoothing 0,
and one colour a run (its curves and its HPARAMS session's `verdict/` points, which live in the
run `<run>/hparams`). On the way the page widens the run list and closes the Time Series
settings pane, settings TensorBoard keeps in the browser (what dragging the list's edge and the
pane's button store), each unless the user has set it: at TensorBoard's 20 % a run's name is
cut within its date and time, before the overrides that tell runs apart. No #fragment is added,
so `/#hparams` still opens HPARAMS; every other address, a link with a state of its own
included, is TensorBoard's, unchanged.
"""

from __future__ import annotations

import html
import json
import sys
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

# A run and its HPARAMS session's run `<run>/hparams` in one colour: the colour group is the
# name without that suffix. fasttrain.callbacks.board.COLOUR_BY_RUN, the same (a test keeps it
# so), is not imported: that module loads Lightning, seconds before TensorBoard could start.
COLOUR_BY_RUN = "regex:^(.+?)(?:/hparams)?$"
LANDING = "?" + urllib.parse.urlencode({"smoothing": 0, "runColorGroup": COLOUR_BY_RUN})
# The run list's width, in % of the page (TensorBoard's own default: 20), and the Time Series
# settings pane closed (TensorBoard opens it): two columns of charts still fit 1400 pixels.
RUN_LIST_PERCENT = 36
DEFAULTS = {"sideBarWidthInPercent": RUN_LIST_PERCENT, "timeSeriesSettingsPaneOpened": False}
# TensorBoard reads its settings from this local-storage key (merged with what it has).
_SETTINGS = "_tb_global_settings"
_PAGE = """<!doctype html><meta charset="utf-8"><title>TensorBoard</title>
<noscript><a href="{href}">TensorBoard</a></noscript>
<script>
let settings = {{}};
try {{ settings = JSON.parse(localStorage.getItem("{key}") || "{{}}"); }} catch (e) {{}}
if (!settings || typeof settings !== "object" || Array.isArray(settings)) settings = {{}};
const defaults = {defaults};
if (Object.keys(defaults).some((name) => !(name in settings))) {{
  localStorage.setItem("{key}", JSON.stringify({{...defaults, ...settings}}));
}}
location.replace("{landing}" + location.hash);
</script>
"""

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def landing_page(path_prefix: str = "") -> bytes:
    """The page served at the bare address: the run list widened, then on to LANDING."""
    landing = path_prefix.rstrip("/") + "/" + LANDING
    page = _PAGE.format(landing=landing, href=html.escape(landing), key=_SETTINGS,
                        defaults=json.dumps(DEFAULTS))  # fmt: skip
    return page.encode()


def unsmoothed_landing(app: Wsgi, path_prefix: str = "") -> Wsgi:
    """`app` with a request for the bare address (no path below the prefix, no query)
    answered by `landing_page`."""
    bare = {path_prefix.rstrip("/") + "/", path_prefix.rstrip("/")}
    page = landing_page(path_prefix)

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") in bare and not environ.get("QUERY_STRING"):
            headers = [
                ("Content-Type", "text/html; charset=utf-8"),
                ("Content-Length", str(len(page))),
                ("Cache-Control", "no-store"),
            ]
            start_response("200 OK", headers)
            return [page]
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
