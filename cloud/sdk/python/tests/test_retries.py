"""The retry rules (docs/sdks.md), one test each: a real 429 from the
limited cloud, a real answer lost by a local peer between the client and
the cloud, and refused connections, 429s and 503s from local peers, whose
request counts show how often a call was sent."""

import json
import os
import re
import time
import unittest
from typing import Any, Dict, List
from unittest import mock

import opgraph
import support
from opgraph import ApiError, TransportError


UUID_V4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")

OK = support.http_answer("200 OK", b'{"accepted":1,"ids":["evt_1"]}')


def refusal(status: str, code: str, retry_after: Any = None) -> bytes:
    """A 429 or 503 in the API's shape, with a Retry-After when given."""
    body = json.dumps({"error": {"code": code, "message": code}}).encode()
    headers = {"Content-Type": "application/json"}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return support.http_answer(status, body, headers)


RATE_LIMITED = refusal("429 Too Many Requests", "rate_limited", 0)
UNAVAILABLE = refusal("503 Service Unavailable", "unavailable", 0)


def burst(client: opgraph.Client, name: str) -> List[Dict[str, Any]]:
    return [client.ingest({"event": name, "properties": {"n": n}}) for n in range(3)]


class RateLimitTest(unittest.TestCase):
    """The limited cloud allows one request per second, burst one."""

    def test_without_retries_a_burst_meets_429(self) -> None:
        client = support.limited_client(max_retries=0)
        with self.assertRaises(ApiError) as caught:
            burst(client, support.unique("burst-refused"))
        error = caught.exception
        self.assertEqual((error.status, error.code), (429, "rate_limited"))
        self.assertGreaterEqual(error.retry_after or 0, 1)

    def test_with_retries_the_same_burst_succeeds(self) -> None:
        client = support.limited_client(max_retries=3)
        name = support.unique("burst-waited")
        answers = burst(client, name)
        ids = [answer["ids"][0] for answer in answers]
        self.assertCountEqual([e["id"] for e in client.events(event=name)], ids)

    def test_with_retries_posts_without_a_key_wait_out_their_429s_too(self) -> None:
        # A 429 is a refusal before any work: even a call that could store
        # twice (no idempotency key) is retried after it.
        client = support.limited_client(max_retries=3)
        names = [support.unique(f"robot-{n}") for n in range(3)]
        created = [client.create_trackable("robot", name) for name in names]
        self.assertEqual([c["trackable"]["name"] for c in created], names)
        listed = client.request("GET", "/api/trackables", query={"limit": 1000})["trackables"]
        for name in names:
            self.assertEqual([t["name"] for t in listed].count(name), 1, name)


class LostAnswerTest(unittest.TestCase):
    def test_a_closed_port_is_a_transport_error_after_the_retries(self) -> None:
        client = opgraph.Client(
            url=f"http://127.0.0.1:{support.closed_port()}",
            api_key="og_x",
            timeout=0.5,
            max_retries=2,
        )
        started = time.monotonic()
        with self.assertRaises(TransportError) as caught:
            client.events()
        # Pauses of 0.2 and 0.4 s came between the three tries.
        self.assertGreaterEqual(time.monotonic() - started, 0.6)
        self.assertIsInstance(caught.exception, opgraph.OpgraphError)
        self.assertIsNotNone(caught.exception.__cause__)

    def test_reads_are_retried_until_max_retries(self) -> None:
        with support.Peer() as peer:
            with self.assertRaises(TransportError):
                opgraph.Client(url=peer.url, api_key="og_x", max_retries=2).events()
        self.assertEqual(len(peer.requests), 3)

    def test_ingest_is_retried_under_one_key(self) -> None:
        with support.Peer() as peer:
            with self.assertRaises(TransportError):
                opgraph.Client(url=peer.url, api_key="og_x", max_retries=2).ingest({"event": "e"})
        keys = [request.get("idempotency-key") for request in peer.requests]
        self.assertEqual(len(keys), 3)
        self.assertIsNotNone(keys[0])
        self.assertEqual(set(keys), {keys[0]})

    def test_a_post_without_a_key_is_sent_once(self) -> None:
        # Even those that mostly read: some of them can write
        # (persist_snapshots, GraphQL mutations).
        calls = {
            "create_trackable": lambda c: c.create_trackable("robot", "x"),
            "enforce": lambda c: c.enforce({}),
            "search": lambda c: c.search("pallet"),
            "metrics": lambda c: c.metrics(),
            "whats_changed": lambda c: c.whats_changed(),
            "agent_context": lambda c: c.agent_context("summarize"),
            "graphql": lambda c: c.graphql("{ events { id } }"),
            "request": lambda c: c.request("POST", "/api/keys", {}),
        }
        for name, call in calls.items():
            with self.subTest(call=name), support.Peer() as peer:
                with self.assertRaises(TransportError):
                    call(opgraph.Client(url=peer.url, api_key="og_x", max_retries=2))
                self.assertEqual(len(peer.requests), 1)

    def test_a_keyed_request_is_retried(self) -> None:
        with support.Peer() as peer:
            client = opgraph.Client(url=peer.url, api_key="og_x", max_retries=2)
            with self.assertRaises(TransportError):
                client.request("POST", "/api/keys", {}, idempotency_key="mine-1")
        self.assertEqual([r.get("idempotency-key") for r in peer.requests], ["mine-1"] * 3)


class TrackKeyTest(unittest.TestCase):
    def test_track_always_carries_a_key_kept_across_its_retries(self) -> None:
        with support.Peer(answer=[None, OK]) as peer:
            client = opgraph.Client(url=peer.url, api_key="og_x", max_retries=2)
            self.assertEqual(client.track("code-1", event="robot.used")["ids"], ["evt_1"])
            client.track("code-1")
            client.track("code-1", idempotency_key="mine-2")
        keys = [request.get("idempotency-key") for request in peer.requests]
        self.assertEqual(len(keys), 4)
        self.assertRegex(keys[0] or "", UUID_V4)
        self.assertEqual(keys[1], keys[0], "the retry carries the first attempt's key")
        self.assertRegex(keys[2] or "", UUID_V4)
        self.assertNotEqual(keys[2], keys[0], "another call has its own key")
        self.assertEqual(keys[3], "mine-2")
        self.assertEqual(
            json.loads(peer.requests[0][":body"]), {"code": "code-1", "event": "robot.used"}
        )

    def test_a_track_whose_answer_was_lost_is_recorded_once(self) -> None:
        cloud = support.client()
        used = support.unique("lost-track")
        code = cloud.create_trackable("sensor", "Cold room", event_name=used)["trackable"]["code"]
        with support.Peer(upstream=support.setting("OPGRAPH_URL"), lose=1) as peer:
            answer = support.client(url=peer.url, max_retries=2).track(code, properties={"c": 4})
        keys = [request.get("idempotency-key") for request in peer.requests]
        self.assertEqual(len(keys), 2, "the lost answer was retried")
        self.assertRegex(keys[0] or "", UUID_V4)
        self.assertEqual(keys[1], keys[0])
        self.assertEqual([e["id"] for e in cloud.events(event=used)], answer["ids"])


class RetryAfterTest(unittest.TestCase):
    def test_a_wait_over_a_minute_is_raised_at_once(self) -> None:
        quota = refusal("429 Too Many Requests", "rate_limited", 3600)
        with support.Peer(answer=quota) as peer:
            with self.assertRaises(ApiError) as caught:
                opgraph.Client(url=peer.url, api_key="og_x").ingest({"event": "e"})
        self.assertEqual(
            (caught.exception.code, caught.exception.retry_after), ("rate_limited", 3600)
        )
        self.assertEqual(len(peer.requests), 1)

    def test_429_with_retry_after_is_retried_even_for_a_post_without_a_key(self) -> None:
        with support.Peer(answer=[RATE_LIMITED, OK]) as peer:
            client = opgraph.Client(url=peer.url, api_key="og_x")
            self.assertEqual(client.create_trackable("robot", "x")["ids"], ["evt_1"])
        self.assertEqual(len(peer.requests), 2)
        self.assertEqual({r.get("idempotency-key") for r in peer.requests}, {None})

    def test_503_with_retry_after_on_a_post_without_a_key_is_sent_once(self) -> None:
        for name, call in {
            "create_trackable": lambda c: c.create_trackable("robot", "x"),
            "search": lambda c: c.search("pallet"),
            "request": lambda c: c.request("POST", "/api/keys", {}),
        }.items():
            with self.subTest(call=name), support.Peer(answer=UNAVAILABLE) as peer:
                with self.assertRaises(ApiError) as caught:
                    call(opgraph.Client(url=peer.url, api_key="og_x", max_retries=2))
                error = caught.exception
                self.assertEqual((error.status, error.code, error.retry_after), (503, "unavailable", 0))
                self.assertEqual(len(peer.requests), 1)

    def test_503_with_retry_after_is_retried_for_a_get_and_keyed_calls(self) -> None:
        calls = {
            "usage": lambda c: c.usage(),
            "ingest": lambda c: c.ingest({"event": "e"}),
            "track": lambda c: c.track("code-1"),
            "request": lambda c: c.request("POST", "/api/keys", {}, idempotency_key="mine-1"),
        }
        for name, call in calls.items():
            with self.subTest(call=name), support.Peer(answer=[UNAVAILABLE, OK]) as peer:
                call(opgraph.Client(url=peer.url, api_key="og_x", max_retries=2))
                self.assertEqual(len(peer.requests), 2)
                keys = [r.get("idempotency-key") for r in peer.requests]
                self.assertEqual(keys[1], keys[0])

    def test_429_or_503_without_retry_after_is_raised_at_once(self) -> None:
        report = {"status": "fail", "version": "0.1.0", "checks": {"store": {"ok": False}}}
        failed = support.http_answer(
            "503 Service Unavailable", json.dumps(report).encode(), {"Content-Type": "application/json"}
        )
        with support.Peer(answer=failed) as peer:
            with self.assertRaises(ApiError) as caught:
                opgraph.Client(url=peer.url, api_key="og_x").health(strict=True)
        error = caught.exception
        self.assertEqual((error.status, error.code, error.retry_after), (503, "unavailable", None))
        self.assertEqual(error.body, report, "strict health's report is kept")
        self.assertEqual(len(peer.requests), 1)

        limited = refusal("429 Too Many Requests", "rate_limited")
        with support.Peer(answer=limited) as peer:
            with self.assertRaises(ApiError) as caught:
                opgraph.Client(url=peer.url, api_key="og_x").usage()
        self.assertEqual((caught.exception.status, caught.exception.retry_after), (429, None))
        self.assertEqual(len(peer.requests), 1)

    def test_a_400_is_not_retried(self) -> None:
        with support.Peer(upstream=support.setting("OPGRAPH_URL")) as peer:
            with self.assertRaises(ApiError) as caught:
                support.client(url=peer.url).ingest({"event": ""})
        self.assertEqual(caught.exception.status, 400)
        self.assertEqual(len(peer.requests), 1)


class WorkspaceTest(unittest.TestCase):
    def test_the_workspace_comes_from_opgraph_workspace_id(self) -> None:
        listed = support.http_answer("200 OK", b'{"events":[]}')
        with support.Peer(answer=listed) as peer:
            with mock.patch.dict(os.environ, {"OPGRAPH_WORKSPACE_ID": "ws_from_env"}):
                from_env = opgraph.Client(url=peer.url, api_key="og_x")
                given = opgraph.Client(url=peer.url, api_key="og_x", workspace="ws_given")
            self.assertEqual(from_env.workspace, "ws_from_env")
            from_env.events()
            given.events()
        sent = [request.get("x-opgraph-workspace-id") for request in peer.requests]
        self.assertEqual(sent, ["ws_from_env", "ws_given"])

        # The real cloud sees it too: another workspace is refused.
        with mock.patch.dict(os.environ, {"OPGRAPH_WORKSPACE_ID": "ws_someone_else"}):
            with self.assertRaises(ApiError) as caught:
                support.client().events(limit=1)
        self.assertEqual((caught.exception.status, caught.exception.code), (403, "forbidden"))
