"""``@parley.tool``: a typed Python function becomes a tool the model may call.

The JSON schema comes from the signature, the descriptions from the docstring::

    @parley.tool
    def grep_count(pattern: str, paths: list[str], ignore_case: bool = False) -> int:
        \"\"\"Count the lines matching a regex.

        Args:
            pattern: a Python regular expression.
            paths: files relative to the workspace root.
            ignore_case: match without regard to case.
        \"\"\"

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``list[T]``,
``dict[str, T]``, ``Literal[...]``, ``Enum`` subclasses, ``X | None`` and other unions,
``Any``, ``TypedDict`` and dataclass types, nested freely; ``Annotated[T, "text"]`` gives
a parameter its description.  Anything else is refused when the function is decorated.
pydantic builds the schema and the conversion (:mod:`parley.tools.schema`); docstrings
in Google, NumPy or reST style are read by ``docstring_parser``.  A parameter annotated
``ToolContext`` (or an unannotated one named ``context``) receives the turn's
:class:`~parley.ports.host.ToolContext` and is not shown to the model.

Arguments are validated against the schema before the function runs; a validation error
goes back to the model as the tool's result.  A ``str`` return value is the result as
is; a :class:`~parley.ports.host.WaitFor` parks the turn until its event
(docs/time.md#waiting-for-an-event); anything else is JSON-encoded.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar, overload

import docstring_parser
from pydantic_core import to_jsonable_python

from parley.errors import InvalidRequest
from parley.ports.host import Access, ToolContext, WaitFor
from parley.tools.base import FunctionTool
from parley.tools.schema import Argument, ArgumentsSchema

P = ParamSpec("P")
R = TypeVar("R")

AccessFunction = Callable[[dict[str, Any]], Sequence[Access]]


@dataclass(frozen=True, kw_only=True)
class DecoratedTool(FunctionTool, Generic[P, R]):
    """What ``@parley.tool`` returns: a :class:`FunctionTool` (so a tool for any
    ``Host``) that can still be called as the plain Python function it wraps."""

    wrapped: Callable[P, R]
    arguments_schema: ArgumentsSchema

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the original function directly (no validation, no policy)."""
        return self.wrapped(*args, **kwargs)

    def parse(self, arguments: str) -> dict[str, Any]:
        """Decode and validate the model's argument text: against the declared schema,
        then by converting it as the call will, so that what pydantic alone refuses (a
        dataclass's ``__post_init__`` raising, say) is refused before the policy is
        asked, not when the function runs."""
        value = super().parse(arguments)
        self.arguments_schema.convert(value, self.name)
        return value


@overload
def tool(function: Callable[P, R], /) -> DecoratedTool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    accesses: AccessFunction | None = None,
) -> Callable[[Callable[P, R]], DecoratedTool[P, R]]: ...


def tool(
    function: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    accesses: AccessFunction | None = None,
) -> DecoratedTool[P, R] | Callable[[Callable[P, R]], DecoratedTool[P, R]]:
    """Make a tool of a typed function: ``@tool`` or ``@tool(name=..., description=...,
    accesses=...)``.

    ``name`` defaults to the function's name, ``description`` to its docstring's text
    before the first section.  ``accesses`` receives the validated arguments (defaults
    filled in) and returns what the call reads, writes or executes, for the host's
    policy; without it the tool declares no access, so the policy can only deny it by
    name (``deny_tools``).  Raises :class:`InvalidRequest` for an annotation it cannot
    express as JSON schema, a missing annotation or description, or ``*args``/``**kwargs``.
    """

    def decorate(target: Callable[P, R]) -> DecoratedTool[P, R]:
        return _build(target, name=name, description=description, accesses=accesses)

    if function is not None:
        return decorate(function)
    return decorate


# --------------------------------------------------------------------------- building


@dataclass(frozen=True)
class _Parameter:
    name: str
    positional_only: bool
    default: Any
    is_context: bool = False


def _build(
    function: Callable[P, R],
    *,
    name: str | None,
    description: str | None,
    accesses: AccessFunction | None,
) -> DecoratedTool[P, R]:
    label = _check_decorated(function, description, accesses)
    try:
        signature = inspect.signature(function)
        hints = typing.get_type_hints(function, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise InvalidRequest(f"@tool {label}: cannot read its signature ({exc})") from exc
    docstring = parse_docstring(inspect.getdoc(function) or "")
    declared, parameters = _read_parameters(signature, hints, docstring.parameters, label)
    schema = ArgumentsSchema(declared, f"@tool {label}")
    text = description if description is not None else docstring.description
    if not text or not text.strip():
        raise InvalidRequest(
            f"@tool {label}: the model needs a description: write a docstring or pass description="
        )
    tool_name = name if name is not None else getattr(function, "__name__", "")
    call = _Call(function, tool_name, schema, tuple(parameters), accesses)
    return DecoratedTool(
        name=tool_name,
        description=text.strip(),
        parameters=schema.json_schema,
        function=call.run,
        access=call.access,
        wrapped=function,
        arguments_schema=schema,
    )


def _check_decorated(
    function: Callable[..., Any], description: str | None, accesses: AccessFunction | None
) -> str:
    """What ``@tool`` refuses before reading a signature; the function's label."""
    if not callable(function):
        raise InvalidRequest(f"@tool needs a function, not {function!r}")
    label = getattr(function, "__qualname__", repr(function))
    if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
        # Its call would return an unawaited coroutine, which the model would get as text.
        raise InvalidRequest(f"@tool {label}: tools run synchronously; make it a plain def")
    if inspect.isgeneratorfunction(function):
        raise InvalidRequest(f"@tool {label}: a tool returns its result; it cannot yield")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"@tool {label}: description must be text")
    if accesses is not None and not callable(accesses):
        raise InvalidRequest(f"@tool {label}: accesses must be a function of the arguments")
    return str(label)


def _read_parameters(
    signature: inspect.Signature,
    hints: dict[str, Any],
    descriptions: Mapping[str, str],
    label: str,
) -> tuple[list[Argument], list[_Parameter]]:
    """The arguments a model declares (all but the context), and how to pass each one."""
    declared: list[Argument] = []
    parameters: list[_Parameter] = []
    for parameter in signature.parameters.values():
        where = f"@tool {label}: parameter {parameter.name!r}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise InvalidRequest(f"{where}: *args and **kwargs cannot be declared to a model")
        annotation = hints.get(parameter.name, inspect.Parameter.empty)
        positional_only = parameter.kind is parameter.POSITIONAL_ONLY
        is_context = _is_context(parameter.name, annotation)
        parameters.append(
            _Parameter(parameter.name, positional_only, parameter.default, is_context)
        )
        if is_context:
            continue
        if annotation is inspect.Parameter.empty:
            raise InvalidRequest(f"{where} has no type annotation")
        declared.append(
            Argument(
                parameter.name, annotation, parameter.default, descriptions.get(parameter.name)
            )
        )
    return declared, parameters


@dataclass(frozen=True)
class _Call:
    """Calls a decorated function with a model's (validated, converted) arguments."""

    function: Callable[..., Any]
    tool_name: str
    schema: ArgumentsSchema
    parameters: tuple[_Parameter, ...]
    accesses: AccessFunction | None

    def run(self, arguments: dict[str, Any], context: ToolContext) -> str | WaitFor:
        values = self.schema.convert(arguments, self.tool_name)
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for item in self.parameters:
            if item.is_context:
                value: Any = context
            elif item.name in values:
                value = values[item.name]
            elif item.positional_only:
                value = item.default  # a later positional-only argument may follow
            else:
                continue  # Python fills in the default
            if item.positional_only:
                positional.append(value)
            else:
                keywords[item.name] = value
        result = self.function(*positional, **keywords)
        if isinstance(result, WaitFor):
            return result  # the turn waits for its event (docs/time.md#waiting-for-an-event)
        return result if isinstance(result, str) else _to_json(result)

    def access(self, arguments: dict[str, Any]) -> Sequence[Access]:
        if self.accesses is None:
            return ()
        return tuple(self.accesses(self._with_defaults(arguments)))

    def _with_defaults(self, arguments: dict[str, Any]) -> dict[str, Any]:
        complete = dict(arguments)
        for item in self.parameters:
            if item.is_context:
                continue
            if item.name not in complete and item.default is not inspect.Parameter.empty:
                complete[item.name] = item.default
        return complete


def _is_context(name: str, annotation: Any) -> bool:
    if annotation is ToolContext:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return members == [ToolContext]
    return name == "context" and annotation is inspect.Parameter.empty


def _to_json(value: Any) -> str:
    # pydantic knows how to make JSON of dataclasses, enums, sets, tuples, paths, dates …;
    # anything it does not is given as its text.
    return json.dumps(
        value, ensure_ascii=False, default=lambda item: to_jsonable_python(item, fallback=str)
    )


# --------------------------------------------------------------------------- docstrings


@dataclass(frozen=True)
class Docstring:
    """A docstring's prose (before its first section) and its parameter descriptions."""

    description: str
    parameters: Mapping[str, str]


def parse_docstring(text: str) -> Docstring:
    """Split a (cleaned) docstring into its prose and its per-parameter descriptions, in
    Google (``Args:``), NumPy (``Parameters`` over dashes) or reST (``:param x:``) style.
    Wrapped lines are joined with spaces, paragraphs kept apart by a blank line."""
    # Of the styles tried, the one that finds the most sections wins; the NumPy reader
    # never fails, so neither does this.
    parsed = docstring_parser.parse(inspect.cleandoc(text))
    parameters = {
        item.arg_name.lstrip("*"): _paragraphs(item.description)
        for item in parsed.params
        if item.description
    }
    return Docstring(description=_paragraphs(parsed.description or ""), parameters=parameters)


def _paragraphs(text: str) -> str:
    """Join wrapped lines into paragraphs separated by a blank line."""
    paragraphs: list[str] = []
    current: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    return "\n\n".join(paragraphs)
