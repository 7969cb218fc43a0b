"""One exchange with the cloud, and the retry rules around it
(docs/sdks.md, "Retries").

Everything below ``urllib`` is caught here and turned into the SDK's two
errors, so callers never meet a raw ``urllib``, ``http.client`` or socket
exception.
"""

import email.utils
import http.client
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterable, Mapping, Optional, Tuple

from .errors import ApiError, TransportError

VERSION = "0.1.0"
USER_AGENT = "opgraph-python/" + VERSION

#: The longest ``Retry-After`` waited out. Longer waits (an exhausted
#: monthly quota answers an hour) are raised at once: no caller wants a
#: call that blocks for an hour.
MAX_RETRY_AFTER = 60

#: The pause before the first retry of a call that got no answer; it
#: doubles with each further retry, up to MAX_BACKOFF.
FIRST_BACKOFF = 0.2
MAX_BACKOFF = 30.0

# The API's code for each status, for answers that lack its error shape
# (a proxy's error page, strict health's report), so that `code` is always
# something to branch on; else `http_<status>`. The same table in all four
# SDKs; a 400 has several codes, so it gets none of them.
_CODE_OF_STATUS = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    500: "internal",
    503: "unavailable",
}

# Characters left as they are in a caller's path: the reserved ones keep
# their meaning (`?`, `&`, `=`, `/`), `%` keeps an existing escape;
# anything else (spaces, non-ASCII) is escaped.
_PATH_SAFE = "/?&=%:@!$'()*+,;-._~"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The API never redirects its calls. Following one would send the
    ``Authorization`` header wherever it points and turn a POST into a GET,
    so a 3xx is handed back as an error instead."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def backoff(retry: int) -> float:
    """The pause before retry number ``retry`` (0-based): 0.2 s, 0.4 s, ...,
    at most 30 s."""
    return min(FIRST_BACKOFF * 2.0 ** min(retry, 32), MAX_BACKOFF)


def parse_retry_after(value: Optional[str]) -> Optional[int]:
    """Whole seconds from a ``Retry-After`` header: a number, or an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        # Python before 3.10 raises TypeError on text that is not a date.
        return None
    return max(0, math.ceil(when.timestamp() - time.time()))


class Transport:
    """Sends calls to one cloud with fixed headers, per-attempt timeout and
    retry budget. Holds no per-call state, so one instance serves any
    number of threads."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        timeout: float,
        max_retries: int,
    ) -> None:
        self.base_url = base_url
        self.headers = dict(headers)
        self.timeout = timeout
        self.max_retries = max_retries
        # build_opener keeps the defaults (proxies from the environment,
        # HTTPS with the platform's roots) and swaps in the redirect rule.
        self._opener = urllib.request.build_opener(_NoRedirect)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
    ) -> Any:
        """Sends the call, retrying by the rules (docs/sdks.md, "Retries"),
        and returns the decoded JSON answer (``None`` for an empty one):

        - no answer: retried after 0.2 s, 0.4 s, ... only when the call is
          retry-safe (a GET, or a call carrying an idempotency key);
        - 429 with ``Retry-After``: the cloud refused before doing anything,
          so any call is retried after the wait;
        - 503 with ``Retry-After``: the store may have taken a write it
          could not answer, so only a retry-safe call is retried;
        - a wait over a minute, a 429 or 503 without ``Retry-After`` (strict
          health's report), and any other answer are raised at once.
        """
        url = self._url(path, query)
        data = None
        if body is not None:
            # allow_nan=False: NaN is not JSON, and the cloud would only
            # refuse it with a 400 after a round trip.
            data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8")
        headers = dict(self.headers)
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        # A call that got no answer, or a 503, may have been carried out;
        # repeating it is safe only if it cannot store twice.
        replayable = method in ("GET", "HEAD") or idempotency_key is not None

        retry = 0
        while True:
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                return self._attempt(request)
            except ApiError as e:
                refused = e.status == 429 or (e.status == 503 and replayable)
                if not refused or retry >= self.max_retries:
                    raise
                if e.retry_after is None or e.retry_after > MAX_RETRY_AFTER:
                    raise
                pause = float(e.retry_after)
            except TransportError:
                if not replayable or retry >= self.max_retries:
                    raise
                pause = backoff(retry)
            time.sleep(pause)
            retry += 1

    def _url(self, path: str, query: Optional[Mapping[str, Any]]) -> str:
        url = self.base_url + urllib.parse.quote(path, safe=_PATH_SAFE)
        pairs = list(_query_pairs(query or {}))
        if pairs:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode(pairs)
        return url

    def _attempt(self, request: urllib.request.Request) -> Any:
        where = f"{request.get_method()} {request.full_url}"
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            # Any answer outside 2xx (urllib raises for those).
            raise _api_error(e.code, e.headers, _read_error_body(e)) from None
        except (OSError, http.client.HTTPException) as e:
            # URLError (refused, DNS, TLS), timeouts and resets are OSErrors;
            # a connection closed mid-answer is an HTTPException.
            reason = getattr(e, "reason", None) or e
            raise TransportError(f"{where}: no answer: {reason}") from e
        if not raw.strip():
            return None
        try:
            return json.loads(raw.decode("utf-8"))
        except ValueError as e:
            raise TransportError(
                f"{where}: the answer ({status}) is not JSON: {raw[:200]!r}"
            ) from e


def _query_pairs(query: Mapping[str, Any]) -> Iterable[Tuple[str, str]]:
    for name, value in query.items():
        if value is None:
            continue
        if isinstance(value, bool):
            # JSON spelling, not Python's `True`.
            yield name, "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield name, str(item)
        else:
            yield name, str(value)


def _read_error_body(e: urllib.error.HTTPError) -> bytes:
    try:
        return e.read()
    except (OSError, http.client.HTTPException):
        # The status is the answer; a body cut short only loses the detail.
        return b""
    finally:
        e.close()


def _api_error(status: int, headers: Any, raw: bytes) -> ApiError:
    retry_after = parse_retry_after(headers.get("Retry-After") if headers else None)
    try:
        body = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except ValueError:
        body = None
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict) and isinstance(detail.get("code"), str):
        field = detail.get("field")
        return ApiError(
            status,
            detail["code"],
            str(detail.get("message") or detail["code"]),
            field=field if isinstance(field, str) and field else None,
            retry_after=retry_after,
            body=body,
        )
    # Not the API's error shape: a proxy's page, a redirect, or JSON of
    # another shape (strict health's report, kept in `body`).
    message = http.client.responses.get(status, "HTTP error")
    location = headers.get("Location") if headers else None
    if 300 <= status < 400 and location:
        message = f"redirected to {location} (not followed)"
    elif body is None and raw.strip():
        message = raw.decode("utf-8", "replace").strip()[:200]
    return ApiError(
        status,
        _CODE_OF_STATUS.get(status, f"http_{status}"),
        message,
        retry_after=retry_after,
        body=body,
    )
