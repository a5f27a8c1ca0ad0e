"""What the events of an OpenAI-compatible stream mean: which chunk carries a token, and which carries an error
(openai_compat.py is the client that reads them).
"""

from __future__ import annotations

from typing import Any


class ServerAnswered(Exception):
    """The server answered a request with an error: an HTTP status, or an error event inside a 200 stream
    (TGI validates there; vLLM reports a failure that way once the stream has begun)."""

    def __init__(self, status: int | None, message: str, in_stream: bool) -> None:
        super().__init__(message)
        self.status = status
        self.in_stream = in_stream

    def where(self) -> str:
        """` (HTTP 422)`, ` (HTTP 422, sent in the stream)`, or nothing where no status was given."""
        if self.status is None:
            return " (an error event in the stream)" if self.in_stream else ""
        return f" (HTTP {self.status}{', sent in the stream' if self.in_stream else ''})"


def stream_error(data: dict[str, Any]) -> ServerAnswered | None:
    """The error an event carries (OpenAI's `{"error": {"message", "code"}}`, TGI's `http_status_code`)."""
    error = data.get("error")
    if error is None:
        return None
    if not isinstance(error, dict):
        return ServerAnswered(None, str(error), in_stream=True)
    status = error.get("http_status_code", error.get("code"))
    return ServerAnswered(status if isinstance(status, int) else None, str(error.get("message", error)), in_stream=True)


def is_token(api: str, content: str | None, finish_reason: str | None) -> bool:
    """Whether a streamed chunk without token ids carries a token. Completions: any text, also an empty one (a
    special token), as vLLM's bench serve counts it, except an empty chunk that only closes the stream
    (llama.cpp's last chunk carries the finish reason alone). Chat: non-empty content (a role-only chunk)."""
    if api == "chat":
        return bool(content)
    return content is not None and (content != "" or finish_reason is None)
