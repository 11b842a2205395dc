"""How /v1 renders chats, as vLLM's chat flags set it: read by the command line
(startup/chatflags.py), applied by the OpenAI-compatible front end (http/openai/catalog.py
chooses the template, template.py renders with it).

- `--chat-template`: the template every chat renders with, in place of each generative
  model's own (vLLM serves one model; here it applies to every model /v1 chats with, and
  gives a model without a template one).
- `--chat-template-content-format`: how a message's content is given to the template
  (http/openai/contentformat.py).
- `--default-chat-template-kwargs`: template variables every chat gets, under the
  request's own `chat_template_kwargs` (which win, key by key).
- `--trust-request-chat-template`: a request's own `chat_template` is rendered with;
  without it such a request is refused, in vLLM's words, since a template is code.
- `--response-role`: the role of an answer where a generation prompt opens its turn.
- `--reasoning-effort-map`: a request's reasoning effort rewritten to one the template
  knows (`{"medium": "low"}`), where templates quietly ignore efforts they do not know;
  the efforts it does not name pass unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

ContentFormatSetting = Literal["auto", "string", "openai"]
CONTENT_FORMATS: Final[tuple[ContentFormatSetting, ...]] = ("auto", "string", "openai")
# vLLM's reasoning efforts, the keys --reasoning-effort-map may name.
EFFORTS: Final = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# A request's template variables of these values are left unset (to the defaults'), as
# vLLM's merge_kwargs leaves them.
_UNSET: Final = (None, "auto")
# The template variables the server sets, never a request's `chat_template_kwargs` (vLLM
# refuses `chat_template` and `tokenize` there, and the rest are the request's own fields).
SERVER_VARIABLES: Final = frozenset({"chat_template", "tokenize", "messages", "tools", "documents"})


@dataclass(frozen=True, slots=True)
class ChatSettings:
    template: str | None = None
    content_format: ContentFormatSetting = "auto"
    default_kwargs: Mapping[str, Any] = field(default_factory=dict)
    trust_request_template: bool = False
    response_role: str = "assistant"
    effort_map: Mapping[str, str] = field(default_factory=dict)

    def effort(self, given: str | None) -> str | None:
        """The reasoning effort the template gets for a request's `given` one."""
        return given if given is None else self.effort_map.get(given, given)

    def variables(self, given: Mapping[str, Any] | None) -> dict[str, Any]:
        """The template's variables: the defaults, then the request's `given` (but for
        its null and "auto" values, as vLLM merges them)."""
        found = dict(self.default_kwargs)
        found.update((key, value) for key, value in (given or {}).items() if value not in _UNSET)
        return found
