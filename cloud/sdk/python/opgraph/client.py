"""The client: settings checked once, then one method per API call
(docs/sdks.md, "Calls"). How a call travels and when it is retried is
``_http``'s business; this file only says which request each call is."""

import os
import urllib.parse
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ._http import USER_AGENT, Transport
from .errors import ApiError, TransportError

__all__ = ["Client", "DEFAULT_URL"]

#: Where a client goes without a URL and without ``OPGRAPH_URL``.
DEFAULT_URL = "http://127.0.0.1:8080"

JSONObject = Dict[str, Any]
Event = Mapping[str, Any]


class Client:
    """A client of one Opgraph cloud.

    Args:
        url: the cloud, ``http://`` or ``https://``; default ``OPGRAPH_URL``,
            else ``http://127.0.0.1:8080``.
        api_key: an API key (``og_...``) or an enterprise token; default
            ``OPGRAPH_API_KEY``. Without one only :meth:`health` works.
        workspace: sent as ``X-Opgraph-Workspace-ID``, which a token naming
            several workspaces needs; default ``OPGRAPH_WORKSPACE_ID``, as
            for the command line.

            An empty ``url``, ``api_key`` or ``workspace`` (or one of only
            spaces, tabs and line breaks) counts as not given, so its
            environment variable applies; an empty variable counts as
            unset too.
        timeout: seconds each attempt may wait on the network.
        max_retries: how many times a call is retried at most (0: never).

    Raises:
        ValueError: a URL that is not http(s), a key or workspace holding
            line breaks or other characters a header cannot carry, a
            timeout that is not positive, a negative ``max_retries``.

    A client holds no per-call state: share one between threads.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        workspace: Optional[str] = None,
        timeout: float = 30.0,
        max_retries: int = 3,
    ) -> None:
        url = _setting(url, "OPGRAPH_URL")
        if url is None:
            url = DEFAULT_URL
        api_key = _setting(api_key, "OPGRAPH_API_KEY")
        workspace = _setting(workspace, "OPGRAPH_WORKSPACE_ID")
        self.url = _base_url(url)
        self.workspace = _header_value("workspace", workspace)
        api_key = _header_value("api_key", api_key)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError("timeout must be a positive number of seconds")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError("max_retries must be an integer, 0 or more")
        self.timeout = float(timeout)
        self.max_retries = max_retries

        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        if api_key is not None:
            headers["Authorization"] = "Bearer " + api_key
        if self.workspace is not None:
            headers["X-Opgraph-Workspace-ID"] = self.workspace
        self._http = Transport(self.url, headers, self.timeout, max_retries)

    def __repr__(self) -> str:
        # Never the key: reprs end up in logs.
        return f"Client(url={self.url!r}, workspace={self.workspace!r})"

    # -- Events ------------------------------------------------------------

    def ingest(
        self,
        event_or_events: Union[Event, Sequence[Event]],
        idempotency_key: Optional[str] = None,
    ) -> JSONObject:
        """Stores one event (a dict) or an all-or-nothing batch (a list, at
        most 1000): ``POST /api/ingest``. Answers ``{"accepted", "ids"}``.

        Always sends an ``Idempotency-Key``: ``idempotency_key``, or a
        random one made here and kept across this call's retries, so a
        batch whose answer was lost is stored once however often it is
        retried. Pass your own to make a later call (a rerun of your
        program) store nothing twice either.
        """
        if isinstance(event_or_events, Mapping):
            body: Any = dict(event_or_events)
        elif isinstance(event_or_events, (list, tuple)):
            body = {"batch": list(event_or_events)}
        else:
            raise TypeError("ingest takes an event (a dict) or a list of events")
        if idempotency_key is None:
            idempotency_key = str(uuid.uuid4())
        return self._answer("POST", "/api/ingest", body, idempotency_key=idempotency_key)

    def events(
        self,
        event: Optional[str] = None,
        trace_id: Optional[str] = None,
        business_id: Optional[str] = None,
        from_: Optional[int] = None,
        to: Optional[int] = None,
        limit: Optional[int] = None,
    ) -> List[JSONObject]:
        """Stored events, newest first, each with ``id`` and ``receivedAt``:
        ``GET /api/events``. Times are ms since the epoch; ``from_`` is
        inclusive, ``to`` exclusive."""
        query = {
            "event": event,
            "traceId": trace_id,
            "businessId": business_id,
            "from": from_,
            "to": to,
            "limit": limit,
        }
        events = self._answer("GET", "/api/events", query=query).get("events")
        if not isinstance(events, list):
            raise TransportError("GET /api/events: the answer has no `events` list")
        return events

    def search(
        self,
        query: str,
        event: Optional[str] = None,
        from_: Optional[int] = None,
        to: Optional[int] = None,
        limit: Optional[int] = None,
        business_id: Optional[str] = None,
    ) -> JSONObject:
        """Case-insensitive search (1 to 200 characters) over event names,
        property values and actor and object ids and types:
        ``POST /api/analytics/event-search``. ``business_id`` keeps one
        business's events. Answers ``{"results", "total",
        "totalCapped"}``."""
        body = _object(
            query=query,
            event=event,
            business_id=business_id,
            from_=from_,
            to=to,
            limit=limit,
        )
        return self._answer("POST", "/api/analytics/event-search", body)

    # -- Analytics ---------------------------------------------------------

    def metrics(self, **options: Any) -> JSONObject:
        """Counts, unique actors and revenue per event name:
        ``POST /api/metrics/query``. Options in snake_case or camelCase:
        ``event_name``, ``from_``, ``to``, ``interval`` (``"hour"`` or
        ``"day"``, adds ``series``), ``limit``, ``business_id``,
        ``persist_snapshots``, ``unique_actors``."""
        return self._answer("POST", "/api/metrics/query", _object(**options))

    def whats_changed(self, **options: Any) -> JSONObject:
        """A period against the one before (default: the last 7 days):
        ``POST /api/analytics/whats-changed``. Options: ``business_id``,
        ``current`` and ``previous`` (``{"from": ms, "to": ms}``),
        ``limit``."""
        return self._answer("POST", "/api/analytics/whats-changed", _object(**options))

    def business_health(self, business_id: str, limit: Optional[int] = None) -> JSONObject:
        """A business's health score, reasons and next actions:
        ``GET /api/businesses/{id}/health``. An unknown business is a 404."""
        if not isinstance(business_id, str) or not business_id:
            raise ValueError("business_id must be a non-empty string")
        # safe="": a `/` in the id must not become a path separator.
        path = "/api/businesses/{}/health".format(urllib.parse.quote(business_id, safe=""))
        return self._answer("GET", path, query={"limit": limit})

    def agent_context(
        self,
        mode: str,
        business_id: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> JSONObject:
        """What an agent should know now: ``POST
        /api/intelligence/agent-context``. ``mode`` is ``summarize``,
        ``recommend_next_actions``, ``detect_anomalies`` or ``proof_gaps``."""
        body = _object(mode=mode, business_id=business_id, limit=limit)
        return self._answer("POST", "/api/intelligence/agent-context", body)

    def graphql(self, query: str, variables: Optional[Mapping[str, Any]] = None) -> Any:
        """Runs a GraphQL document (``POST /api/graphql``) and returns its
        ``data``. An answer with ``errors`` raises :class:`ApiError` with
        status 200, code ``graphql`` and the list in ``errors``, so partial
        ``data`` is never mistaken for a whole answer."""
        body: JSONObject = {"query": query}
        if variables is not None:
            body["variables"] = dict(variables)
        answer = self._answer("POST", "/api/graphql", body)
        errors = answer.get("errors")
        if errors:
            first = errors[0] if isinstance(errors, list) and isinstance(errors[0], dict) else {}
            extensions = first.get("extensions")
            field = extensions.get("field") if isinstance(extensions, dict) else None
            raise ApiError(
                200,
                "graphql",
                str(first.get("message") or "GraphQL error"),
                field=field if isinstance(field, str) else None,
                errors=errors if isinstance(errors, list) else [errors],
                body=answer,
            )
        return answer.get("data")

    # -- Governance and trackables -----------------------------------------

    def enforce(self, request: Mapping[str, Any]) -> JSONObject:
        """Asks governance whether a proposed action may go ahead:
        ``POST /api/governance/enforce`` with ``decisionObjectId``,
        ``authorityGrantId``, ``contextContractId`` and ``proposedAction``
        (sent as given). Answers ``{"outcome", "receiptId", "checks",
        "receipt"}``; ``deny`` is an answer, not an error."""
        return self._answer("POST", "/api/governance/enforce", dict(request))

    def track(
        self,
        code: str,
        event: Optional[str] = None,
        properties: Optional[Mapping[str, Any]] = None,
        actor: Any = None,
        *,
        timestamp: Optional[int] = None,
        business_id: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> JSONObject:
        """Records a use of a registered trackable by its code:
        ``POST /api/track``. Answers ``{"accepted", "ids"}``.

        Like :meth:`ingest`, always sends an ``Idempotency-Key``:
        ``idempotency_key``, or a random one made here and kept across this
        call's retries, so a use whose answer was lost is recorded once."""
        body = _object(
            code=code,
            event=event,
            properties=properties,
            actor=actor,
            timestamp=timestamp,
            business_id=business_id,
        )
        if idempotency_key is None:
            idempotency_key = str(uuid.uuid4())
        return self._answer("POST", "/api/track", body, idempotency_key=idempotency_key)

    def create_trackable(self, kind: str, name: str, **options: Any) -> JSONObject:
        """Registers a trackable: ``POST /api/trackables``. ``kind`` is
        ``qr_code``, ``barcode``, ``rfid_tag``, ``sensor``, ``robot``,
        ``ai_agent``, ``mcp_server`` or ``cli_workflow``. Options:
        ``target_url`` (required for a QR code), ``event_name``,
        ``include_qr_svg``, ``code`` (an external identifier). Answers
        ``{"trackable": {...}, "qrSvg"?}``."""
        return self._answer("POST", "/api/trackables", _object(kind=kind, name=name, **options))

    # -- Operations --------------------------------------------------------

    def usage(self, limit: Optional[int] = None) -> JSONObject:
        """The workspace's metering: ``GET /api/usage``."""
        return self._answer("GET", "/api/usage", query={"limit": limit})

    def health(self, strict: bool = False) -> JSONObject:
        """Readiness: ``GET /api/health``. With ``strict`` a failed required
        check is a 503, raised as :class:`ApiError` with the report in
        ``body``."""
        return self._answer("GET", "/api/health", query={"strict": "1" if strict else None})

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
    ) -> Any:
        """Any other call, e.g. ``request("POST", "/api/keys", {"scopes":
        ["read"]})``. Same errors and retries as the named calls; answers
        the decoded JSON (``None`` for an empty answer)."""
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError("path must start with `/`, e.g. /api/usage")
        return self._call(method.upper(), path, body, query, idempotency_key)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
    ) -> Any:
        if idempotency_key is not None and not _header_value("idempotency_key", idempotency_key):
            raise ValueError("idempotency_key must not be empty")
        return self._http.call(method, path, body, query, idempotency_key)

    def _answer(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
    ) -> JSONObject:
        """A named call: its answer is a JSON object, or not the API's."""
        answer = self._call(method, path, body, query, idempotency_key)
        if not isinstance(answer, dict):
            raise TransportError(f"{method} {path}: the answer is not a JSON object")
        return answer


def _base_url(url: str) -> str:
    if not isinstance(url, str):
        raise ValueError("url must be a string")
    url = url.strip()
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 - parses the port, raising on a bad one
    except ValueError:
        raise ValueError(f"url has a bad port: {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url must be an http:// or https:// URL, got {url!r}")
    if parts.query or parts.fragment or any(c <= " " or c == "\x7f" for c in url):
        raise ValueError(f"url must be a plain base URL, without query or spaces: {url!r}")
    return url.rstrip("/")


#: What a setting may hold and still count as not given (see ``_given``).
_BLANK = " \t\n\v\f\r"


def _given(value: Optional[str]) -> Optional[str]:
    """A setting as given, or ``None`` when it counts as not given:
    missing, or a string of nothing but spaces, tabs and line breaks (the
    same rule in all four SDKs), so that ``OPGRAPH_WORKSPACE_ID=`` or
    ``api_key=""`` falls through to the next source instead of sending an
    empty header. Other values are left for the checks that follow."""
    if isinstance(value, str) and not value.strip(_BLANK):
        return None
    return value


def _setting(value: Optional[str], variable: str) -> Optional[str]:
    """The setting given, else the environment variable, else ``None``."""
    value = _given(value)
    return value if value is not None else _given(os.environ.get(variable))


def _header_value(setting: str, value: Optional[str]) -> Optional[str]:
    """Checks a value bound for a header. Line breaks would let it forge
    other headers; http.client would refuse them only mid-call, and other
    non-ASCII text cannot be sent at all. The value is not echoed: it may
    be a secret."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{setting} must be a string")
    if any(not (" " <= c <= "~") for c in value):
        raise ValueError(
            f"{setting} must be printable ASCII: it holds a line break or another "
            "character an HTTP header cannot carry"
        )
    return value


def _object(**fields: Any) -> JSONObject:
    """A request body from keyword arguments: ``None`` left out, names in
    the API's camelCase (``business_id`` and ``businessId`` both become
    ``businessId``; ``from_`` becomes ``from``)."""
    return {_camel(name): value for name, value in fields.items() if value is not None}


def _camel(name: str) -> str:
    head, *rest = name.rstrip("_").split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)
