"""How a chat template is given a message's content: vLLM's `--chat-template-content-format`.

- "string": the content as one string, text parts joined by a line break (what most
  templates print with `{{ message['content'] }}`).
- "openai": the content as OpenAI's parts, `[{"type": "text", "text": "..."}]` (a string
  sent becomes one part, none no part): what multimodal templates walk with
  `{% for part in message['content'] %}`. Given a string, such a template walks its
  characters and prints nothing, so the message is silently lost from the prompt.
- "auto" (the default): "openai" where the template loops over a message's content,
  "string" otherwise, found in the template's syntax tree as vLLM finds it: a `for` over
  `<message>.content` (or `['content']`), where `<message>` is the target of a `for` over
  `messages` or over a name set from it (`{% set rest = messages[1:] %}`, a
  `namespace(rest=messages)` attribute); a `for` over a bare `content` outside macros;
  or, inside a macro, a `for` over a parameter that some call passes a message's content.

A tool message's content stays a string in both forms (vLLM's: most templates print a
tool's result as text).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Literal

import jinja2.nodes as nodes

ContentFormat = Literal["string", "openai"]
_MESSAGES: Final = "messages"
_CONTENT: Final = "content"


def walks_parts(tree: nodes.Template) -> bool:
    """Whether the template (parsed by template.py's environment) loops over a
    message's content: "auto" gives it "openai"."""
    return any(True for _ in _content_loops(tree))


def _dotted(node: nodes.Node) -> str | None:
    """`x`, `ns.rest` (a name and its attributes) as a dotted name, else None."""
    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.NSRef):
        return f"{node.name}.{node.attr}"
    if isinstance(node, nodes.Getattr):
        parent = _dotted(node.node)
        return None if parent is None else f"{parent}.{node.attr}"
    return None


def _unwrapped(node: nodes.Node) -> nodes.Node:
    """What a filter, a test or a slice applies to (`messages|reverse`, `messages[1:]`)."""
    while True:
        filtered = isinstance(node, nodes.Filter | nodes.Test) and node.node is not None
        sliced = isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)
        if not (filtered or sliced):
            return node
        node = node.node  # type: ignore[attr-defined]


def _names(node: nodes.Node, names: set[str]) -> bool:
    """Whether `node` is (a filter, test or slice of) one of `names`."""
    return _dotted(_unwrapped(node)) in names


def _content_of(node: nodes.Node, messages: set[str]) -> bool:
    """Whether `node` is (a filter, test or slice of) `<message>.content` or
    `<message>['content']` for one of the `messages` variables."""
    node = _unwrapped(node)
    if isinstance(node, nodes.Getattr) and node.attr == _CONTENT:
        return _dotted(node.node) in messages
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return node.arg.value == _CONTENT and _dotted(node.node) in messages
    return False


def _message_lists(tree: nodes.Template) -> set[str]:
    """`messages` and every name set from it, transitively."""
    found = {_MESSAGES}
    grown = True
    while grown:
        grown = False
        for assign in tree.find_all(nodes.Assign):
            aliases: list[str] = []
            target, value = assign.target, assign.node
            if isinstance(value, nodes.Call) and _dotted(value.node) == "namespace":
                if isinstance(target, nodes.Name):
                    aliases = [
                        f"{target.name}.{kwarg.key}"
                        for kwarg in value.kwargs
                        if _names(kwarg.value, found)
                    ]
            elif _names(value, found):
                alias = _dotted(target)
                aliases = [alias] if alias is not None else []
            for alias in aliases:
                if alias not in found:
                    found.add(alias)
                    grown = True
    return found


def _message_items(tree: nodes.Template) -> set[str]:
    """The targets of the loops over a list of messages."""
    lists = _message_lists(tree)
    return {
        loop.target.name
        for loop in tree.find_all(nodes.For)
        if isinstance(loop.target, nodes.Name) and _names(loop.iter, lists)
    }


def _macro_content_parameters(tree: nodes.Template, messages: set[str]) -> dict[int, set[str]]:
    """For each loop inside a macro, the macro's parameters that some call passes a
    message's content (by position or by keyword)."""
    found: dict[int, set[str]] = {}
    for macro in tree.find_all(nodes.Macro):
        parameters = [argument.name for argument in macro.args]
        given: set[str] = set()
        for call in tree.find_all(nodes.Call):
            if _dotted(call.node) != macro.name:
                continue
            for position, argument in enumerate(call.args[: len(parameters)]):
                if _content_of(argument, messages):
                    given.add(parameters[position])
            for keyword in call.kwargs:
                if keyword.key in parameters and _content_of(keyword.value, messages):
                    given.add(keyword.key)
        for loop in macro.find_all(nodes.For):
            found[id(loop)] = given
    return found


def _content_loops(tree: nodes.Template) -> Iterator[nodes.For]:
    messages = _message_items(tree)
    in_macros = _macro_content_parameters(tree, messages)
    for loop in tree.find_all(nodes.For):
        if _content_of(loop.iter, messages):
            yield loop
        elif isinstance(loop.iter, nodes.Name):
            name = loop.iter.name
            parameters = in_macros.get(id(loop))
            if parameters is None and name == _CONTENT:
                yield loop  # `{% set content = message['content'] %}...{% for part in content %}`
            elif parameters is not None and name in parameters:
                yield loop
