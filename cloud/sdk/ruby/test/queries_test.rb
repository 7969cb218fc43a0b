# frozen_string_literal: true

require "test_helper"

# The read and decision calls, each against events this test stored.
class QueriesTest < Minitest::Test
  include CloudHelpers

  def test_search_finds_an_event_by_a_property_value
    name = unique("search")
    serial = "SN-#{SecureRandom.hex(5)}"
    id = client.ingest({ "event" => name, "properties" => { "serial" => serial } })["ids"].first
    found = client.search(serial.downcase)
    assert_equal [id], found["results"].map { |e| e["id"] }
    assert_equal 1, found["total"]
    assert_empty client.search(serial, event: "#{name}.other")["results"]
  end

  def test_graphql_returns_data_and_raises_on_errors
    name = unique("graphql")
    ids = client.ingest([{ "event" => name }, { "event" => name }])["ids"]
    data = client.graphql("query($e: String) { events(event: $e, limit: 10) { id event } }",
                          variables: { "e" => name })
    assert_equal ids.sort, data["events"].map { |e| e["id"] }.sort
    assert_equal [name], data["events"].map { |e| e["event"] }.uniq

    error = assert_api_error(200, "graphql") { client.graphql("{ noSuchField }") }
    refute_empty error.errors
    assert_includes error.message, "noSuchField"
  end

  def test_a_tracked_use_of_a_created_trackable_is_an_event
    name = unique("used")
    created = client.create_trackable("sensor", "ruby suite sensor", event_name: name)
    trackable = created["trackable"]
    assert_equal name, trackable["eventName"]
    tracked = client.track(trackable["code"], properties: { "celsius" => 21.5 }, actor: "ruby-suite")
    listed = client.events(event: name)
    assert_equal tracked["ids"], listed.map { |e| e["id"] }
    assert_equal({ "kind" => "sensor", "code" => trackable["code"], "id" => trackable["id"] },
                 listed.first["trackable"])
    assert_equal 21.5, listed.first.dig("properties", "celsius")

    assert_api_error(404, "not_found") { client.track("no-such-code-#{SecureRandom.hex(4)}") }
  end

  def test_a_qr_code_takes_its_options_in_snake_case
    created = client.create_trackable(:qr_code, "ruby poster", target_url: "https://example.com/p",
                                                               include_qr_svg: true)
    assert_equal "https://example.com/p", created.dig("trackable", "targetUrl")
    assert_includes created["qrSvg"], "<svg"
    error = assert_api_error(400, "validation_failed") { client.create_trackable("qr_code", "no target") }
    assert_equal "targetUrl", error.field
  end

  def test_enforce_denies_an_action_naming_missing_objects
    decision = client.enforce(decision_object_id: "dec_missing", authority_grant_id: "grt_missing",
                              context_contract_id: "ctc_missing", proposed_action: { action: "ship" })
    assert_equal "deny", decision["outcome"]
    assert decision["receiptId"].is_a?(String), decision.inspect
    refute_empty decision["checks"]
    refute decision["checks"].all? { |c| c["passed"] }, decision["checks"].inspect
  end

  def test_metrics_count_this_tests_events
    name = unique("metrics")
    client.ingest(Array.new(2) { { "event" => name, "actor" => "ruby-suite" } })
    answer = client.metrics(event_name: name, interval: "day")
    assert_equal [name], answer["metrics"].map { |m| m["eventName"] }
    assert_equal 2, answer["metrics"].first["count"]
    assert_equal 1, answer["metrics"].first["uniqueActors"]
    assert_equal 2, answer["totalEvents"]
    assert answer["series"].is_a?(Array), answer.keys.inspect
    assert answer["definitions"].is_a?(Array), answer.keys.inspect
  end

  def test_whats_changed_lists_a_new_event_type
    name = unique("changed")
    client.ingest({ "event" => name })
    answer = client.whats_changed(limit: 1000)
    %w[current previous revenueDelta eventDiffs disappearedEventTypes].each do |key|
      assert answer.key?(key), "#{key} missing from #{answer.keys}"
    end
    assert_includes answer["newEventTypes"], name
    now = (Time.now.to_f * 1000).to_i
    earlier = client.whats_changed(current: { from: now - 60_000, to: now + 60_000 },
                                   previous: { from: 0, to: 1 })
    assert_equal 1, earlier.dig("previous", "to")
  end

  def test_agent_context_answers_its_mode
    answer = client.agent_context(:summarize, business_id: "default", limit: 5)
    assert_equal "summarize", answer["mode"]
    assert_equal "default", answer["businessId"]
    %w[anomalies missingProofEvents nextActions].each do |key|
      assert answer[key].is_a?(Array), "#{key}: #{answer[key].inspect}"
    end
    error = assert_api_error(400, "validation_failed") { client.agent_context("guess") }
    assert_includes error.message, "summarize"
  end

  def test_business_health_of_default_and_of_an_unknown_id
    answer = client.business_health("default")
    assert_equal "default", answer["businessId"]
    assert_includes 0..100, answer["healthScore"]
    # A slash and a space must stay inside the one path segment.
    assert_api_error(404, "not_found") { client.business_health("north/dock 3") }
  end

  def test_usage_counts_ingested_events
    before = client.usage["events"]["ingested"]
    client.ingest({ "event" => unique("usage") })
    answer = client.usage
    assert answer["workspaceId"].start_with?("ws_"), answer.inspect
    assert_operator answer["events"]["ingested"], :>, before
    %w[period apiCalls connectors agents rateLimit].each do |key|
      assert answer.key?(key), "#{key} missing from #{answer.keys}"
    end
  end

  def test_health_reports_its_checks
    answer = client.health
    assert_includes %w[ok degraded], answer["status"]
    assert answer["checks"].key?("store"), answer.inspect
    assert answer["version"].is_a?(String), answer.inspect
    # Every required check of the test cloud passes, so strict agrees.
    assert_equal "ok", client.health(strict: true)["status"]
  end
end
