"""Trackables and governance against the real cloud."""

import uuid

import support
from opgraph import ApiError, TransportError


class TrackablesTest(support.CloudTest):
    def test_a_created_trackable_is_tracked_by_its_code(self) -> None:
        used = support.unique("sensor-read")
        code = "EPC" + uuid.uuid4().hex[:16].upper()
        created = self.client.create_trackable(
            "sensor", "Cold room probe", event_name=used, code=code
        )
        trackable = created["trackable"]
        self.assertTrue(trackable["id"].startswith("trk_"))
        self.assertEqual((trackable["code"], trackable["eventName"]), (code, used))

        answer = self.client.track(code, properties={"celsius": 4.5}, actor="probe-1")
        stored = self.client.events(event=used)
        self.assertEqual([e["id"] for e in stored], answer["ids"])
        self.assertEqual(stored[0]["trackable"]["code"], code)
        self.assertEqual(stored[0]["trackable"]["id"], trackable["id"])
        self.assertEqual(stored[0]["properties"], {"celsius": 4.5})

    def test_a_qr_code_needs_a_target_and_can_come_as_svg(self) -> None:
        created = self.client.create_trackable(
            "qr_code", "Door sign", target_url="https://example.com/menu", include_qr_svg=True
        )
        self.assertEqual(created["trackable"]["targetUrl"], "https://example.com/menu")
        self.assertIn("<svg", created["qrSvg"])

        with self.assertRaises(ApiError) as caught:
            self.client.create_trackable("qr_code", "No target")
        self.assertEqual((caught.exception.status, caught.exception.field), (400, "targetUrl"))

    def test_a_create_whose_answer_is_lost_is_not_sent_again(self) -> None:
        # No idempotency key: repeating it could register it twice.
        name = support.unique("lost-create")
        with support.Peer(upstream=support.setting("OPGRAPH_URL"), lose=1) as peer:
            with self.assertRaises(TransportError):
                support.client(url=peer.url).create_trackable("robot", name)
        self.assertEqual(len(peer.requests), 1)
        listed = self.client.request("GET", "/api/trackables", query={"limit": 1000})
        self.assertEqual([t["name"] for t in listed["trackables"]].count(name), 1)

    def test_tracking_an_unknown_code_is_404(self) -> None:
        with self.assertRaises(ApiError) as caught:
            self.client.track(support.unique("nocode"))
        self.assertEqual((caught.exception.status, caught.exception.code), (404, "not_found"))


class GovernanceTest(support.CloudTest):
    def test_enforcing_against_missing_objects_denies(self) -> None:
        answer = self.client.enforce(
            {
                "decisionObjectId": "dec_missing",
                "authorityGrantId": "grt_missing",
                "contextContractId": "ctc_missing",
                "proposedAction": {"action": "refund", "amount": 10, "currency": "EUR"},
            }
        )
        self.assertEqual(answer["outcome"], "deny")
        self.assertTrue(answer["receiptId"])
        self.assertTrue(answer["checks"])
        self.assertFalse(all(check["passed"] for check in answer["checks"]))

    def test_a_malformed_request_is_400(self) -> None:
        with self.assertRaises(ApiError) as caught:
            self.client.enforce({"proposedAction": {"action": "refund"}})
        self.assertEqual(
            (caught.exception.status, caught.exception.code), (400, "validation_failed")
        )
