# frozen_string_literal: true

require "test_helper"

# The retry rules of docs/sdks.md, one test each, from a local server whose
# request counts show how often a call was sent: 429 and 503 with and
# without Retry-After, lost answers, and the key track always carries.
class RetryRulesTest < Minitest::Test
  include CloudHelpers

  UUID_V4 = /\A\h{8}-\h{4}-4\h{3}-[89ab]\h{3}-\h{12}\z/.freeze
  OK = FakeServer.answer(200, { "accepted" => 1, "ids" => ["evt_1"] })
  RATE_LIMITED = FakeServer.answer(429, { "error" => { "code" => "rate_limited", "message" => "slow down" } },
                                   "Retry-After" => "0")
  UNAVAILABLE = FakeServer.answer(503, { "error" => { "code" => "unavailable", "message" => "store" } },
                                  "Retry-After" => "0")

  def with_fake(*script, max_retries: 3)
    server = FakeServer.new(*script)
    yield Opgraph::Client.new(url: server.url, api_key: "og_fake", max_retries: max_retries), server
  ensure
    server&.close
  end

  def test_429_with_retry_after_is_retried_for_any_call_a_post_without_a_key_too
    with_fake(RATE_LIMITED, OK) do |fake, server|
      assert_equal ["evt_1"], fake.create_trackable(:robot, "amr-7")["ids"]
      assert_equal 2, server.requests.size
      assert(server.requests.none? { |r| r["headers"].key?("idempotency-key") })
    end
  end

  def test_503_with_retry_after_on_a_post_without_a_key_is_sent_once
    {
      "create_trackable" => ->(c) { c.create_trackable(:robot, "amr-7") },
      "search" => ->(c) { c.search("pallet") },
      "request" => ->(c) { c.request(:post, "/api/keys", body: {}) }
    }.each do |name, call|
      with_fake(UNAVAILABLE, OK) do |fake, server|
        error = assert_raises(Opgraph::ApiError, name) { call.call(fake) }
        assert_equal [503, "unavailable", 0], [error.status, error.code, error.retry_after], name
        assert_equal 1, server.requests.size, name
      end
    end
  end

  def test_503_with_retry_after_is_retried_for_a_get_and_keyed_calls
    {
      "usage" => ->(c) { c.usage },
      "ingest" => ->(c) { c.ingest({ "event" => "e" }) },
      "track" => ->(c) { c.track("amr-7") },
      "request" => ->(c) { c.request(:post, "/api/keys", body: {}, idempotency_key: "mine-1") }
    }.each do |name, call|
      with_fake(UNAVAILABLE, OK) do |fake, server|
        call.call(fake)
        keys = server.requests.map { |r| r["headers"]["idempotency-key"] }
        assert_equal 2, keys.size, name
        assert_equal 1, keys.uniq.size, name
      end
    end
  end

  def test_429_or_503_without_retry_after_is_raised_at_once
    report = { "status" => "fail", "version" => "0.1.0", "checks" => { "store" => { "ok" => false } } }
    with_fake(FakeServer.answer(503, report), OK) do |fake, server|
      error = assert_raises(Opgraph::ApiError) { fake.health(strict: true) }
      assert_equal [503, "unavailable", nil], [error.status, error.code, error.retry_after]
      assert_equal report, error.body, "strict health's report is kept"
      assert_equal 1, server.requests.size
    end
    limited = FakeServer.answer(429, { "error" => { "code" => "rate_limited", "message" => "no wait" } })
    with_fake(limited, OK) do |fake, server|
      error = assert_raises(Opgraph::ApiError) { fake.usage }
      assert_equal [429, nil], [error.status, error.retry_after]
      assert_equal 1, server.requests.size
    end
  end

  def test_a_wait_over_a_minute_is_raised_at_once
    quota = FakeServer.answer(429, { "error" => { "code" => "rate_limited", "message" => "quota" } },
                              "Retry-After" => "3600")
    with_fake(quota, OK) do |fake, server|
      error = assert_raises(Opgraph::ApiError) { fake.usage }
      assert_equal ["rate_limited", 3600], [error.code, error.retry_after]
      assert_equal 1, server.requests.size
    end
  end

  def test_no_answer_a_post_that_mostly_reads_is_sent_once
    {
      "search" => ->(c) { c.search("pallet") },
      "metrics" => ->(c) { c.metrics },
      "whats_changed" => ->(c) { c.whats_changed },
      "agent_context" => ->(c) { c.agent_context(:summarize) },
      "graphql" => ->(c) { c.graphql("{ events { id } }") },
      "enforce" => ->(c) { c.enforce({}) }
    }.each do |name, call|
      with_fake(nil, max_retries: 2) do |fake, server|
        assert_raises(Opgraph::TransportError, name) { call.call(fake) }
        assert_equal 1, server.requests.size, name
      end
    end
  end

  def test_track_always_carries_a_key_kept_across_its_retries
    with_fake(nil, OK, max_retries: 2) do |fake, server|
      assert_equal ["evt_1"], fake.track("amr-7", event: "robot.used")["ids"]
      fake.track("amr-7")
      fake.track("amr-7", idempotency_key: "mine-2")
      keys = server.requests.map { |r| r["headers"]["idempotency-key"] }
      assert_equal 4, keys.size
      assert_match UUID_V4, keys[0]
      assert_equal keys[0], keys[1], "the retry carries the first attempt's key"
      assert_match UUID_V4, keys[2]
      refute_equal keys[0], keys[2], "another call has its own key"
      assert_equal "mine-2", keys[3]
      assert_equal({ "code" => "amr-7", "event" => "robot.used" }, JSON.parse(server.requests[0]["body"]))
    end
  end

  def test_an_answer_without_the_api_shape_gets_the_code_of_its_status
    with_fake(FakeServer.answer(502, "<html>bad gateway</html>")) do |fake, server|
      error = assert_raises(Opgraph::ApiError) { fake.usage }
      assert_equal [502, "http_502"], [error.status, error.code]
      assert_equal 1, server.requests.size
    end
  end
end
