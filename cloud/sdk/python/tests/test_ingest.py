"""Ingest against the real cloud: single events, batches, validation, and
idempotency, judged by what `events()` then lists."""

import json
import uuid
from typing import Any, Dict, List

import support
from opgraph import ApiError, OpgraphError


class IngestTest(support.CloudTest):
    def test_a_single_event_sent_twice_under_one_key_is_stored_once(self) -> None:
        name = support.unique("single")
        key = "key-" + uuid.uuid4().hex
        event = {"event": name, "actor": "reader-1", "properties": {"dock": 3}}
        first = self.client.ingest(event, idempotency_key=key)
        again = self.client.ingest(event, idempotency_key=key)

        self.assertEqual(first["accepted"], 1)
        self.assertEqual(len(first["ids"]), 1)
        self.assertTrue(first["ids"][0].startswith("evt_"))
        self.assertEqual(again["ids"], first["ids"])
        stored = self.client.events(event=name)
        self.assertEqual([e["id"] for e in stored], first["ids"])
        self.assertEqual(stored[0]["actor"], "reader-1")
        self.assertEqual(stored[0]["properties"], {"dock": 3})

    def test_a_batch_is_stored_whole(self) -> None:
        name = support.unique("batch")
        answer = self.client.ingest([{"event": name, "properties": {"n": n}} for n in range(3)])

        self.assertEqual(answer["accepted"], 3)
        self.assertEqual(len(set(answer["ids"])), 3)
        stored = self.client.events(event=name)
        self.assertCountEqual([e["id"] for e in stored], answer["ids"])
        self.assertEqual(sorted(e["properties"]["n"] for e in stored), [0, 1, 2])

    def test_a_batch_with_one_invalid_event_stores_none_of_it(self) -> None:
        name = support.unique("invalid")
        batch: List[Dict[str, Any]] = [{"event": name}, {"properties": {"n": 1}}, {"event": name}]
        with self.assertRaises(ApiError) as caught:
            self.client.ingest(batch)

        error = caught.exception
        self.assertIsInstance(error, OpgraphError)
        self.assertEqual(
            (error.status, error.code, error.field), (400, "validation_failed", "batch[1].event")
        )
        self.assertTrue(error.message)
        self.assertIsNone(error.retry_after)
        self.assertIn("batch[1].event", str(error))
        self.assertEqual(self.client.events(event=name), [])

    def test_a_lost_answer_is_retried_under_the_same_made_up_key_and_stored_once(self) -> None:
        name = support.unique("lost")
        with support.Peer(upstream=support.setting("OPGRAPH_URL"), lose=1) as peer:
            answer = support.client(url=peer.url).ingest([{"event": name}, {"event": name}])

        # The cloud got the batch twice and kept it once.
        self.assertEqual(len(peer.requests), 2)
        keys = {request.get("idempotency-key") for request in peer.requests}
        self.assertEqual(len(keys), 1)
        self.assertNotIn(None, keys)
        stored = self.client.events(event=name)
        self.assertCountEqual([e["id"] for e in stored], answer["ids"])
        self.assertEqual(len(stored), 2)

    def test_a_lost_answer_under_the_callers_key_is_stored_once(self) -> None:
        name = support.unique("lost-keyed")
        key = "pallet-7-" + uuid.uuid4().hex
        with support.Peer(upstream=support.setting("OPGRAPH_URL"), lose=2) as peer:
            answer = support.client(url=peer.url).ingest({"event": name}, idempotency_key=key)

        self.assertEqual([r["idempotency-key"] for r in peer.requests], [key, key, key])
        self.assertEqual([e["id"] for e in self.client.events(event=name)], answer["ids"])

    def test_each_call_sends_its_headers_and_a_key_of_its_own(self) -> None:
        name = support.unique("headers")
        with support.Peer(upstream=support.setting("OPGRAPH_URL")) as peer:
            relayed = support.client(url=peer.url)
            relayed.ingest({"event": name})
            relayed.ingest({"event": name})

        first, second = peer.requests
        self.assertNotEqual(first["idempotency-key"], second["idempotency-key"])
        self.assertEqual(first[":request"], "POST /api/ingest HTTP/1.1")
        self.assertEqual(first["authorization"], "Bearer " + support.setting("OPGRAPH_API_KEY"))
        self.assertEqual(first["content-type"], "application/json")
        self.assertEqual(first["user-agent"], "opgraph-python/0.1.0")
        self.assertEqual(json.loads(first[":body"]), {"event": name})
        self.assertEqual(len(self.client.events(event=name)), 2)

    def test_anything_but_an_event_or_a_list_is_refused_before_sending(self) -> None:
        with self.assertRaises(TypeError):
            self.client.ingest("pallet.scanned")  # type: ignore[arg-type]
