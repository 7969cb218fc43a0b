"""The two ways a call fails, under one base class.

An :class:`ApiError` means the cloud answered and said no (any status
outside 2xx, or a GraphQL answer with ``errors``); a :class:`TransportError`
means no usable answer came. Callers that only want "did it work" catch
:class:`OpgraphError`.
"""

from typing import Any, Dict, List, Optional

__all__ = ["OpgraphError", "ApiError", "TransportError"]


class OpgraphError(Exception):
    """Base of every error a call raises."""


class ApiError(OpgraphError):
    """The cloud answered with an error.

    Attributes:
        status: the HTTP status (200 for a GraphQL error).
        code: the API's snake_case code, e.g. ``validation_failed``, or
            ``graphql``. An answer without the API's error shape (a proxy's
            page) gets the code the API uses for that status.
        message: text for a human.
        field: the JSON path at fault, e.g. ``batch[3].event``, if any.
        retry_after: seconds the cloud asked to wait (``Retry-After``), if any.
        errors: the GraphQL errors, for code ``graphql``.
        body: the decoded answer, when it was JSON (strict health's report).
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: Optional[str] = None,
        retry_after: Optional[int] = None,
        errors: Optional[List[Dict[str, Any]]] = None,
        body: Any = None,
    ) -> None:
        super().__init__(status, code, message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after
        self.errors = errors
        self.body = body

    def __str__(self) -> str:
        # The same one line as the command line prints.
        text = f"HTTP {self.status} {self.code}: {self.message}"
        if self.field:
            text += f" (field {self.field})"
        return text

    def __reduce__(self) -> Any:
        # Exceptions pickle through their args; these carry more.
        return (
            ApiError,
            (
                self.status,
                self.code,
                self.message,
                self.field,
                self.retry_after,
                self.errors,
                self.body,
            ),
        )


class TransportError(OpgraphError):
    """No usable answer: refused connection, timeout, TLS failure, a
    connection closed mid-answer, or a body that is not the API's JSON.

    The underlying exception, if any, is chained as ``__cause__``.
    """
