"""Reading calls against the real cloud: each finds what the test stored,
or answers its documented shape."""

import uuid

import support
from opgraph import ApiError


class QueriesTest(support.CloudTest):
    def test_events_filter_by_trace_business_and_limit(self) -> None:
        name = support.unique("filters")
        trace = "trace-" + uuid.uuid4().hex
        # A `/` and a space: the business id must travel encoded.
        business = "north/dock 3 " + uuid.uuid4().hex[:8]
        answer = self.client.ingest(
            [
                {"event": name, "traceId": trace, "businessId": business},
                {"event": name},
                {"event": name},
            ]
        )
        traced = self.client.events(trace_id=trace)
        self.assertEqual([e["id"] for e in traced], answer["ids"][:1])
        self.assertEqual([e["traceId"] for e in self.client.events(business_id=business)], [trace])
        self.assertEqual(len(self.client.events(event=name, limit=2)), 2)
        stamp = traced[0]["timestamp"]
        self.assertEqual(len(self.client.events(event=name, from_=stamp + 3_600_000)), 0)

        health = self.client.business_health(business)
        self.assertEqual(health["businessId"], business)

    def test_search_finds_an_event_by_a_property_value(self) -> None:
        name = support.unique("search")
        needle = "pallet-" + uuid.uuid4().hex
        stored = self.client.ingest({"event": name, "properties": {"label": needle.upper()}})
        found = self.client.search(needle)
        self.assertEqual([r["id"] for r in found["results"]], stored["ids"])
        self.assertEqual(found["total"], 1)
        self.assertEqual(self.client.search(needle, event=support.unique("other"))["total"], 0)

    def test_search_keeps_one_business(self) -> None:
        needle = "crate-" + uuid.uuid4().hex
        north, south = support.unique("north"), support.unique("south")
        name, label = support.unique("search"), {"label": needle}
        stored = self.client.ingest(
            [
                {"event": name, "businessId": north, "properties": label},
                {"event": name, "businessId": south, "properties": label},
            ]
        )
        self.assertEqual(self.client.search(needle)["total"], 2)
        found = self.client.search(needle, business_id=south)
        self.assertEqual([r["id"] for r in found["results"]], stored["ids"][1:])
        self.assertEqual(found["results"][0]["businessId"], south)
        self.assertEqual(self.client.search(needle, business_id=support.unique("none"))["total"], 0)

    def test_graphql_returns_data_and_raises_its_errors(self) -> None:
        name = support.unique("graphql")
        stored = self.client.ingest({"event": name})
        data = self.client.graphql(
            "query($name: String) { events(event: $name) { id event } }", {"name": name}
        )
        self.assertEqual(data, {"events": [{"id": stored["ids"][0], "event": name}]})

        with self.assertRaises(ApiError) as caught:
            self.client.graphql("{ noSuchField }")
        error = caught.exception
        self.assertEqual((error.status, error.code), (200, "graphql"))
        self.assertIsInstance(error.errors, list)
        self.assertTrue(error.errors)
        self.assertIn("noSuchField", error.message)

    def test_metrics_count_what_was_stored(self) -> None:
        name = support.unique("metrics")
        self.client.ingest([{"event": name, "actor": "a"}, {"event": name, "actor": "b"}])
        answer = self.client.metrics(event_name=name, interval="day")
        self.assertEqual(len(answer["metrics"]), 1)
        row = answer["metrics"][0]
        self.assertEqual((row["eventName"], row["count"], row["uniqueActors"]), (name, 2, 2))
        self.assertEqual(answer["totalEvents"], 2)
        self.assertIsInstance(answer["series"], list)
        self.assertIsInstance(answer["definitions"], list)

    def test_whats_changed_names_a_new_event_type(self) -> None:
        name = support.unique("changed")
        self.client.ingest({"event": name})
        answer = self.client.whats_changed(limit=1000)
        for key in ("current", "previous", "revenueDelta", "eventDiffs", "disappearedEventTypes"):
            self.assertIn(key, answer)
        self.assertIn(name, answer["newEventTypes"])
        self.assertGreaterEqual(answer["current"]["totalEvents"], 1)

    def test_agent_context_answers_its_mode(self) -> None:
        answer = self.client.agent_context("summarize", business_id="default", limit=10)
        self.assertEqual((answer["mode"], answer["businessId"]), ("summarize", "default"))
        for key in ("anomalies", "missingProofEvents", "nextActions"):
            self.assertIsInstance(answer[key], list)
        self.assertIn("current", answer["changes"])

        with self.assertRaises(ApiError) as caught:
            self.client.agent_context("guess")
        self.assertEqual(
            (caught.exception.status, caught.exception.code), (400, "validation_failed")
        )

    def test_business_health_of_default(self) -> None:
        answer = self.client.business_health("default")
        self.assertEqual(answer["businessId"], "default")
        self.assertTrue(0 <= answer["healthScore"] <= 100)
        for key in ("revenue", "scans", "leads", "orders", "recentEvents", "nextActions"):
            self.assertIn(key, answer)

    def test_usage_counts_this_workspace(self) -> None:
        answer = self.client.usage()
        self.assertTrue(answer["workspaceId"].startswith("ws_"))
        self.assertGreaterEqual(answer["apiCalls"], 1)
        for key in ("ingested", "quota", "remaining"):
            self.assertIn(key, answer["events"])
        self.assertIn("rateLimit", answer)

    def test_health_reports_its_checks(self) -> None:
        for strict in (False, True):
            with self.subTest(strict=strict):
                answer = self.client.health(strict=strict)
                self.assertIn(answer["status"], ("ok", "degraded"))
                self.assertTrue(answer["version"])
                for check in ("store", "config", "integrations", "rateLimiting", "usageMetering"):
                    self.assertIn(check, answer["checks"])
