# frozen_string_literal: true

require "test_helper"

# Ingest and its errors, judged by what the cloud then lists.
class IngestTest < Minitest::Test
  include CloudHelpers

  def test_a_repeated_idempotency_key_stores_once
    name = unique("idempotent")
    event = { "event" => name, "actor" => "ruby-suite", "properties" => { "n" => 1 } }
    first = client.ingest(event, idempotency_key: "ruby-#{name}")
    again = client.ingest(event, idempotency_key: "ruby-#{name}")
    assert_equal 1, first["accepted"]
    assert_equal first["ids"], again["ids"]
    listed = client.events(event: name)
    assert_equal first["ids"], listed.map { |e| e["id"] }
    assert_equal "ruby-suite", listed.first["actor"]
  end

  def test_a_batch_is_stored_whole
    name = unique("batch")
    answer = client.ingest(Array.new(3) { |i| { "event" => name, "properties" => { "i" => i } } })
    assert_equal 3, answer["accepted"]
    assert_equal 3, answer["ids"].uniq.size
    assert answer["ids"].all? { |id| id.start_with?("evt_") }, answer.inspect
    listed = client.events(event: name, limit: 10)
    assert_equal answer["ids"].sort, listed.map { |e| e["id"] }.sort
  end

  def test_an_invalid_batch_element_is_named_and_nothing_is_stored
    name = unique("invalid")
    batch = [{ "event" => name }, { "actor" => "no-event" }, { "event" => name }]
    error = assert_api_error(400, "validation_failed") { client.ingest(batch) }
    assert_equal "batch[1].event", error.field
    refute_empty error.message
    assert_empty client.events(event: name)
  end

  def test_a_wrong_key_is_unauthorized
    stranger = Opgraph::Client.new(url: setting("OPGRAPH_URL"), api_key: "og_wrong#{SecureRandom.hex(16)}")
    assert_api_error(401, "unauthorized") { stranger.events(limit: 1) }
  end

  def test_a_read_only_key_reads_but_cannot_ingest
    created = client.request(:post, "/api/keys", body: { name: "ruby read-only", scopes: ["read"] })
    assert_equal ["read"], created.dig("key", "scopes")
    reader = Opgraph::Client.new(url: setting("OPGRAPH_URL"), api_key: created.fetch("apiKey"))
    name = unique("forbidden")
    assert_api_error(403, "forbidden") { reader.ingest({ "event" => name }) }
    assert_empty reader.events(event: name)
    client.ingest({ "event" => name })
    assert_equal [name], reader.events(event: name).map { |e| e["event"] }
  end

  def test_a_call_outside_the_api_is_an_api_error_too
    assert_api_error(404, "not_found") { client.request(:get, "/api/trackables/trk_missing") }
  end
end
