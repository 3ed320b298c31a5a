"""The web page's modules import downwards only, as import-linter holds the Python packages
to their layers (CONTRIBUTING.md, "Where each concept lives").

The page is plain ES modules (``src/parley/gateway/static``).  Its import graph, read from
every module's import statements, has no cycle, and each import goes to a module of the
importer's layer or of one under it in :data:`LAYERS`, where every module must be placed.
A circle of modules loads only while the names crossing it are hoisted function
declarations: the first ``const`` one of them reads at load time throws.

The imports are read by a small, strict parser: it knows the forms the page writes, and
any other ``import`` or ``export`` fails the test with its file and line, so a form it
cannot read never hides an edge.  Only a line that is a comment up to the word (it starts
with ``//``, or ``/*`` or ``*`` and has not closed the comment) is prose it skips; in a
string or a comment after code, the word fails the test too."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

from parley.gateway.routers import page

STATIC = Path(str(page.STATIC))  # the folder the gateway serves the page from
ENTRY = "app.js"

LAYERS: dict[str, tuple[str, ...]] = {
    # Starts the page: wires the views' actions to the controllers and the page's
    # controls to both.
    "wiring": ("app.js",),
    # Own the page's state and talk to the gateway; they show it through the views.
    "controllers": (
        "page/batches.js",
        "page/followed-turns.js",
        "page/schedules.js",
        "page/sessions.js",
        "page/shown-session.js",
        "page/sidebar-polling.js",
        "page/turn-actions.js",
    ),
    # The gateway as the page reaches it: its JSON API, the tab's token, a turn's event
    # stream.  Above the views, so that a view cannot call the gateway; they show what
    # they must (a failure in a banner, the lock screen).
    "gateway": ("page/api.js", "page/token.js", "page/turn-stream.js"),
    # Render the state and report what the user did through the actions they are given.
    "views": (
        "page/banners.js",
        "page/batch-list.js",
        "page/compaction-divider.js",
        "page/composer.js",
        "page/conversation.js",
        "page/header.js",
        "page/schedule-list.js",
        "page/scroll.js",
        "page/session-list.js",
        "page/sidebar.js",
        "page/tree.js",
        "page/turn/agents.js",
        "page/turn/approvals.js",
        "page/turn/foot.js",
        "page/turn/reply.js",
        "page/turn/steers.js",
        "page/turn/steps.js",
        "page/turn/tools.js",
        "page/turn/view.js",
    ),
    # What everything above uses: the state, DOM helpers, text, icons, statuses, the
    # Markdown renderer, the event-stream parser.
    "base": (
        "page/dom.js",
        "page/format.js",
        "page/icons.js",
        "page/markdown.js",
        "page/sse.js",
        "page/state.js",
        "page/status.js",
    ),
    # The vendored libraries (vendor/README.md).
    "vendor": ("vendor/marked.esm.js", "vendor/purify.min.js"),
}

_IDENT = r"[A-Za-z_$][\w$]*"
_FROM = r"(?<![\w$])from(?![\w$])"
_BINDING = rf"{_IDENT}(?:\s+as\s+{_IDENT})?"
_NAMED = rf"\{{\s*(?:{_BINDING}\s*(?:,\s*{_BINDING}\s*)*,?\s*)?\}}"
_NAMESPACE = rf"\*\s*as\s+{_IDENT}"
_CLAUSE = rf"(?:{_NAMED}|{_NAMESPACE}|{_IDENT}(?:\s*,\s*(?:{_NAMED}|{_NAMESPACE}))?)"
_SPECIFIER = r"""(?:"(?P<double>[^"\\\n]*)"|'(?P<single>[^'\\\n]*)')"""

# Each tried where the keyword starts; those with a specifier make an edge.
_WITH_SPECIFIER = (
    re.compile(rf"import\s*(?:{_CLAUSE}\s*{_FROM}\s*)?{_SPECIFIER}\s*;"),
    re.compile(rf"import\s*\(\s*{_SPECIFIER}\s*\)"),
    re.compile(rf"export\s*(?:{_NAMED}|\*(?:\s*as\s+{_IDENT})?)\s*{_FROM}\s*{_SPECIFIER}\s*;"),
)
_WITHOUT_SPECIFIER = (
    re.compile(rf"export\s*{_NAMED}\s*;"),
    re.compile(r"export\s+(?:default|async\s+function|function\*?|class|const|let|var)(?![\w$])"),
)
_KEYWORD = re.compile(r"(?<![\w$.])(?:import|export)(?![\w$])")


class UnreadImport(ValueError):
    """An ``import`` or ``export`` the parser does not read, or an import of a module that
    is not one of the page's."""


@dataclass(frozen=True, kw_only=True)
class Import:
    """A module specifier as written, and the line it is on."""

    specifier: str
    line: int


def _in_a_comment_line(source: str, at: int) -> bool:
    """Whether the line of position ``at`` is a comment up to it: it starts with ``//``, or
    with ``/*`` or ``*`` (a block comment, or a line of one) not closed before ``at``."""
    before = source[source.rfind("\n", 0, at) + 1 : at].lstrip()
    return before.startswith("//") or (before.startswith(("/*", "*")) and "*/" not in before)


def read_imports(source: str, module: str) -> list[Import]:
    """Every module ``source`` imports or re-exports from, in order; :class:`UnreadImport`
    for any ``import`` or ``export`` keyword, outside a comment line, that does not start
    a form read here."""
    found = []
    for keyword in _KEYWORD.finditer(source):
        if _in_a_comment_line(source, keyword.start()):
            continue
        line = source.count("\n", 0, keyword.start()) + 1
        with_specifier = [p.match(source, keyword.start()) for p in _WITH_SPECIFIER]
        matched = next((m for m in with_specifier if m), None)
        if matched:
            specifier = matched["double"] if matched["double"] is not None else matched["single"]
            found.append(Import(specifier=specifier, line=line))
        elif not any(p.match(source, keyword.start()) for p in _WITHOUT_SPECIFIER):
            text = source[keyword.start() :].split("\n", 1)[0]
            raise UnreadImport(f"{module}:{line}: a form this test does not read: {text!r}")
    return found


def resolve(module: str, found: Import, modules: set[str]) -> str:
    """The page module ``found`` names from ``module``: a relative path to a ``.js`` file of
    the page (a bare name or an absolute path would be resolved by no import map here)."""
    where = f"{module}:{found.line}: {found.specifier!r}"
    if not found.specifier.startswith(("./", "../")) or not found.specifier.endswith(".js"):
        raise UnreadImport(f"{where} is not a relative path to a .js file")
    target = posixpath.normpath(posixpath.join(posixpath.dirname(module), found.specifier))
    if target not in modules:
        raise UnreadImport(f"{where} names no module of the page ({target})")
    return target


def page_modules() -> set[str]:
    """Every ``.js`` file the page serves, as a path under ``static/``."""
    return {path.relative_to(STATIC).as_posix() for path in STATIC.rglob("*.js")}


def import_graph() -> dict[str, set[str]]:
    """Each module of the page → the modules it imports."""
    modules = page_modules()
    return {
        module: {
            resolve(module, found, modules)
            for found in read_imports((STATIC / module).read_text("utf-8"), module)
        }
        for module in sorted(modules)
    }


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def layer_of() -> dict[str, int]:
    """Each module placed in :data:`LAYERS` → its layer's rank, 0 at the top."""
    return {module: rank for rank, members in enumerate(LAYERS.values()) for module in members}


def test_the_parser_reads_the_forms_the_page_writes() -> None:
    source = """
import { a, b as c } from "./a.js";
import {
  d, e,
} from "../b.js";
import f, { g } from './c.js';
import * as h from "./d.js";
import i, * as j from "./e.js";
import "./f.js"; // for what it sets
export { k } from "./g.js";
export * from "./h.js";
export * as l from "./i.js";
const m = await import("./j.js");
export const n = 1;
export async function o() {}
export function p() {}
export class Q {}
export { m, n as r };
document.importNode(x);
// the views import no controller
/** A view's actions: what it would import
 *  from a controller if it could. */
"""
    assert [(found.specifier, found.line) for found in read_imports(source, "x.js")] == [
        ("./a.js", 2),
        ("../b.js", 3),
        ("./c.js", 6),
        ("./d.js", 7),
        ("./e.js", 8),
        ("./f.js", 9),
        ("./g.js", 10),
        ("./h.js", 11),
        ("./i.js", 12),
        ("./j.js", 13),
    ]


@pytest.mark.parametrize(
    "source",
    [
        "const url = import.meta.url;",
        "const module = await import(name);",
        'import { a } from "./a.js"',  # the house writes the semicolon
        "import { a } from `./a.js`;",
        'import { "a" as b } from "./a.js";',
        'export { a } from "./a.js"',
        "export = a;",
        'const hint = "export the list";',
        "render(); // views import no controller",
        '/* the views */ import "./a.js"',
    ],
)
def test_the_parser_refuses_any_other_import_or_export(source: str) -> None:
    with pytest.raises(UnreadImport, match=r"^x\.js:1: a form this test does not read"):
        read_imports(source, "x.js")


@pytest.mark.parametrize(
    ("specifier", "refusal"),
    [
        ("marked", "is not a relative path"),
        ("/static/page/dom.js", "is not a relative path"),
        ("./dom", "is not a relative path"),
        ("./missing.js", r"names no module of the page \(page/missing\.js\)"),
        ("../../outside.js", r"names no module of the page \(\.\./outside\.js\)"),
    ],
)
def test_an_import_names_a_module_of_the_page(specifier: str, refusal: str) -> None:
    found = Import(specifier=specifier, line=3)
    with pytest.raises(UnreadImport, match=rf"^page/x\.js:3: .* {refusal}"):
        resolve("page/x.js", found, {"page/x.js", "page/dom.js"})
    assert resolve("page/turn/x.js", Import(specifier="../dom.js", line=1), {"page/dom.js"}) == (
        "page/dom.js"
    )


def test_every_module_of_the_page_is_placed_in_one_layer() -> None:
    placed = [module for members in LAYERS.values() for module in members]
    assert len(placed) == len(set(placed)), "a module placed twice"
    modules = page_modules()
    assert not modules - set(placed), f"not placed in LAYERS: {sorted(modules - set(placed))}"
    assert not set(placed) - modules, f"placed, but not there: {sorted(set(placed) - modules)}"


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.scripts.append(dict(attrs))


def test_the_page_loads_app_js_which_reaches_every_module() -> None:
    """One entry, the top layer's module; a module nothing reaches would be dead code."""
    scripts = _Scripts()
    scripts.feed((STATIC / "index.html").read_text("utf-8"))
    assert scripts.scripts == [{"type": "module", "src": f"/static/{ENTRY}"}]
    graph = import_graph()
    reached = {ENTRY}
    waiting = [ENTRY]
    while waiting:
        for target in graph[waiting.pop()] - reached:
            reached.add(target)
            waiting.append(target)
    assert reached == set(graph), f"reached from no import: {sorted(set(graph) - reached)}"


def test_the_page_imports_form_no_cycle() -> None:
    graph = import_graph()
    cycles = [
        component
        for component in strongly_connected(graph)
        if len(component) > 1 or component[0] in graph[component[0]]
    ]
    assert not cycles, "modules that import each other, through others or directly:\n" + (
        "\n".join(" ".join(component) for component in cycles)
    )


def test_every_import_goes_to_its_own_layer_or_one_under_it() -> None:
    rank = layer_of()
    names = list(LAYERS)
    graph = import_graph()
    assert set(graph) <= set(rank), f"not placed in LAYERS: {sorted(set(graph) - set(rank))}"
    upward = [
        f"{module} ({names[rank[module]]}) imports {target} ({names[rank[target]]})"
        for module, targets in graph.items()
        for target in sorted(targets)
        if rank[target] < rank[module]
    ]
    assert not upward, "\n".join(upward)
