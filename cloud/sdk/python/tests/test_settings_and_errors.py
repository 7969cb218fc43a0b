"""Client settings (checked when the client is made) and the error fields
of the cloud's 401, 403 and 404 answers, and of answers that are not the
API's."""

import os
import unittest
from unittest import mock

import opgraph
import support
from opgraph import ApiError, TransportError


class SettingsTest(unittest.TestCase):
    def test_bad_settings_are_refused_when_the_client_is_made(self) -> None:
        for settings in [
            {"url": "ftp://127.0.0.1:8080"},
            {"url": "127.0.0.1:8080"},
            {"url": "http://"},
            {"url": "http://127.0.0.1:notaport"},
            {"api_key": "og_abc\nX-Injected: 1"},
            {"api_key": "og_abc\r"},
            {"workspace": "ws_a\r\nX-Injected: 1"},
            {"timeout": 0},
            {"max_retries": -1},
        ]:
            with self.subTest(settings=settings), self.assertRaises(ValueError):
                opgraph.Client(**settings)  # type: ignore[arg-type]

    def test_the_refusal_does_not_repeat_the_key(self) -> None:
        with self.assertRaises(ValueError) as caught:
            opgraph.Client(api_key="og_secret\n")
        self.assertNotIn("og_secret", str(caught.exception))

    def test_the_environment_fills_what_is_not_given(self) -> None:
        env = {
            "OPGRAPH_URL": support.setting("OPGRAPH_URL"),
            "OPGRAPH_API_KEY": support.setting("OPGRAPH_API_KEY"),
        }
        with mock.patch.dict(os.environ, env):
            client = opgraph.Client()
        self.assertEqual(client.url, env["OPGRAPH_URL"].rstrip("/"))
        self.assertIsInstance(client.events(limit=1), list)

        bare = {k: v for k, v in os.environ.items() if not k.startswith("OPGRAPH_")}
        with mock.patch.dict(os.environ, bare, clear=True):
            self.assertEqual(opgraph.Client().url, "http://127.0.0.1:8080")

    def test_an_empty_setting_counts_as_not_given(self) -> None:
        listed = support.http_answer("200 OK", b'{"events":[]}')
        blanks = ["", "   ", "\t\r\n"]
        with support.Peer(answer=listed) as peer:
            env = {
                "OPGRAPH_URL": peer.url + "/",
                "OPGRAPH_API_KEY": "og_from_env",
                "OPGRAPH_WORKSPACE_ID": "ws_from_env",
            }
            with mock.patch.dict(os.environ, env):
                for blank in blanks:
                    client = opgraph.Client(url=blank, api_key=blank, workspace=blank)
                    self.assertEqual((client.url, client.workspace), (peer.url, "ws_from_env"))
                    client.events()
        sent = [(r.get("authorization"), r.get("x-opgraph-workspace-id")) for r in peer.requests]
        self.assertEqual(sent, [("Bearer og_from_env", "ws_from_env")] * len(blanks))

    def test_an_empty_variable_counts_as_unset(self) -> None:
        listed = support.http_answer("200 OK", b'{"events":[]}')
        names = ["OPGRAPH_URL", "OPGRAPH_API_KEY", "OPGRAPH_WORKSPACE_ID"]
        with support.Peer(answer=listed) as peer:
            for empty in ["", " "]:
                with mock.patch.dict(os.environ, {name: empty for name in names}):
                    bare = opgraph.Client(url=empty, api_key=empty, workspace=empty)
                    self.assertEqual((bare.url, bare.workspace), ("http://127.0.0.1:8080", None))
                    opgraph.Client(url=peer.url, api_key=empty, workspace=empty).events()
        # No key or workspace header at all, not an empty one.
        for request in peer.requests:
            self.assertNotIn("authorization", request)
            self.assertNotIn("x-opgraph-workspace-id", request)
        self.assertEqual(len(peer.requests), 2)

    def test_the_repr_never_shows_the_key(self) -> None:
        client = support.client()
        self.assertNotIn(support.setting("OPGRAPH_API_KEY"), repr(client))


class CredentialTest(support.CloudTest):
    def test_a_wrong_key_is_401(self) -> None:
        wrong = support.client(api_key="og_wrongwrongwrongwrongwrongwrong")
        with self.assertRaises(ApiError) as caught:
            wrong.events()
        self.assertEqual((caught.exception.status, caught.exception.code), (401, "unauthorized"))
        self.assertTrue(caught.exception.message)

    def test_no_key_reaches_health_only(self) -> None:
        url = support.setting("OPGRAPH_URL")
        with mock.patch.dict(os.environ, {"OPGRAPH_API_KEY": ""}):
            anonymous = opgraph.Client(url=url)
        self.assertIn(anonymous.health()["status"], ("ok", "degraded", "fail"))
        with self.assertRaises(ApiError) as caught:
            anonymous.usage()
        self.assertEqual(caught.exception.status, 401)

    def test_a_read_only_key_reads_but_cannot_ingest(self) -> None:
        created = self.client.request(
            "POST", "/api/keys", {"name": support.unique("reader"), "scopes": ["read"]}
        )
        self.assertEqual(created["key"]["scopes"], ["read"])
        reader = support.client(api_key=created["apiKey"])

        with self.assertRaises(ApiError) as caught:
            reader.ingest({"event": support.unique("refused")})
        self.assertEqual((caught.exception.status, caught.exception.code), (403, "forbidden"))
        self.assertIsInstance(reader.events(limit=1), list)

    def test_the_workspace_header_is_sent(self) -> None:
        own = self.client.usage()["workspaceId"]
        self.assertIsInstance(support.client(workspace=own).events(limit=1), list)
        with self.assertRaises(ApiError) as caught:
            support.client(workspace="ws_someone_else").events(limit=1)
        self.assertEqual((caught.exception.status, caught.exception.code), (403, "forbidden"))

    def test_an_unknown_business_is_404(self) -> None:
        with self.assertRaises(ApiError) as caught:
            self.client.business_health(support.unique("nobody"))
        self.assertEqual((caught.exception.status, caught.exception.code), (404, "not_found"))


class ForeignAnswerTest(unittest.TestCase):
    """Answers a proxy or another server might give, from a local peer."""

    def test_a_2xx_body_that_is_not_json_is_a_transport_error(self) -> None:
        page = support.http_answer("200 OK", b"<html>captive portal</html>")
        with support.Peer(answer=page) as peer:
            with self.assertRaises(TransportError):
                opgraph.Client(url=peer.url, api_key="og_x", max_retries=0).usage()

    def test_an_error_page_is_an_api_error_with_its_status(self) -> None:
        page = support.http_answer("502 Bad Gateway", b"<html>bad gateway</html>")
        with support.Peer(answer=page) as peer:
            with self.assertRaises(ApiError) as caught:
                opgraph.Client(url=peer.url, api_key="og_x").usage()
        self.assertEqual(caught.exception.status, 502)
        self.assertIn("bad gateway", caught.exception.message)

    def test_a_redirect_is_not_followed(self) -> None:
        moved = support.http_answer("302 Found", b"", {"Location": "http://elsewhere.invalid/"})
        with support.Peer(answer=moved) as peer:
            with self.assertRaises(ApiError) as caught:
                opgraph.Client(url=peer.url, api_key="og_x").usage()
        self.assertEqual(caught.exception.status, 302)
        self.assertEqual(len(peer.requests), 1)
