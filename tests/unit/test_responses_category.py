"""The Responses API's and the Messages API's routes are in the restricted-API category
`inference`, as chat's; Cohere's embed route, as /v1/embeddings."""

from __future__ import annotations

from ge_serve.server.control.restrictions import http_category


def test_the_responses_routes_are_inference() -> None:
    for path in ("/v1/responses", "/v1/responses/resp_1", "/v1/responses/resp_1/cancel"):
        assert http_category(path) == http_category("/v1/chat/completions") == "inference"
        assert http_category("/openai" + path) == "inference"


def test_the_messages_routes_are_inference() -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        assert http_category(path) == http_category("/openai" + path) == "inference"


def test_the_cohere_embed_route_is_the_embeddings_category() -> None:
    assert http_category("/v2/embed") == http_category("/v1/embeddings") == "inference"
    assert http_category("/v2/embed/x") is None
