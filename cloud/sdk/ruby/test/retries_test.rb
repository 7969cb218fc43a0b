# frozen_string_literal: true

require "socket"
require "test_helper"

# Retries: a real 429 from the rate-limited cloud, answers lost on the way
# (a proxy here that drops them), and a port where nothing listens.
class RetriesTest < Minitest::Test
  include CloudHelpers

  UUID_V4 = /\A\h{8}-\h{4}-4\h{3}-[89ab]\h{3}-\h{12}\z/.freeze

  # The limited cloud allows one request per second with a burst of one,
  # so back-to-back calls cannot all be admitted.
  def test_a_burst_without_retries_meets_rate_limited
    quick = limited_client(max_retries: 0)
    error = assert_raises(Opgraph::ApiError) { 3.times { quick.usage } }
    assert_equal 429, error.status
    assert_equal "rate_limited", error.code
    assert_operator error.retry_after, :>=, 1
  end

  def test_a_burst_with_retries_all_succeeds_and_stores_once
    patient = limited_client(max_retries: 3)
    name = unique("limited")
    answers = Array.new(3) { |i| patient.ingest({ "event" => name, "properties" => { "i" => i } }) }
    assert_equal [1, 1, 1], answers.map { |a| a["accepted"] }
    listed = patient.events(event: name)
    assert_equal answers.flat_map { |a| a["ids"] }.sort, listed.map { |e| e["id"] }.sort
  end

  def test_a_burst_of_posts_without_a_key_waits_out_its_429s_too
    # A 429 is a refusal before any work: even a call that could store
    # twice (no idempotency key) is retried after it.
    patient = limited_client(max_retries: 3)
    names = Array.new(3) { |i| unique("robot-#{i}") }
    created = names.map { |name| patient.create_trackable(:robot, name) }
    assert_equal names, created.map { |c| c.dig("trackable", "name") }
    listed = patient.request(:get, "/api/trackables", query: { limit: 1000 })["trackables"].map { |t| t["name"] }
    names.each { |name| assert_equal 1, listed.count(name), name }
  end

  def test_a_closed_port_is_a_transport_error_after_the_retries
    server = TCPServer.new("127.0.0.1", 0)
    port = server.addr[1]
    server.close
    closed = Opgraph::Client.new(url: "http://127.0.0.1:#{port}", api_key: "og_unused", timeout: 1, max_retries: 2)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    error = assert_raises(Opgraph::TransportError) { closed.usage }
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    assert_kind_of SystemCallError, error.cause
    assert_includes error.message, "GET /api/usage"
    # The two pauses between three attempts: 0.2 s then 0.4 s.
    assert_operator elapsed, :>=, 0.55
  end

  def test_a_lost_batch_answer_is_retried_with_the_same_key_and_stored_once
    proxy = LosingProxy.new(URI(setting("OPGRAPH_URL")), lose: 1)
    through = Opgraph::Client.new(url: proxy.url, api_key: setting("OPGRAPH_API_KEY"), max_retries: 2)
    name = unique("lost")
    answer = through.ingest([{ "event" => name }, { "event" => name }])
    keys = proxy.idempotency_keys
    assert_equal 2, keys.size
    assert_equal 1, keys.uniq.size
    assert_equal answer["ids"].sort, client.events(event: name).map { |e| e["id"] }.sort
  ensure
    proxy&.close
  end

  def test_a_lost_track_answer_is_retried_with_the_same_key_and_recorded_once
    name = unique("lost-track")
    code = client.create_trackable(:sensor, "cold room", event_name: name).dig("trackable", "code")
    proxy = LosingProxy.new(URI(setting("OPGRAPH_URL")), lose: 1)
    through = Opgraph::Client.new(url: proxy.url, api_key: setting("OPGRAPH_API_KEY"), max_retries: 2)
    answer = through.track(code, properties: { "celsius" => 4 })
    keys = proxy.idempotency_keys
    assert_equal 2, keys.size, "the lost answer was retried"
    assert_match UUID_V4, keys.first
    assert_equal 1, keys.uniq.size
    assert_equal answer["ids"], client.events(event: name).map { |e| e["id"] }
  ensure
    proxy&.close
  end

  def test_a_write_without_a_key_is_not_repeated_but_a_read_is
    proxy = LosingProxy.new(URI(setting("OPGRAPH_URL")), lose: 100)
    through = Opgraph::Client.new(url: proxy.url, api_key: setting("OPGRAPH_API_KEY"), max_retries: 2)
    assert_raises(Opgraph::TransportError) { through.create_trackable(:robot, unique("lost-create")) }
    assert_equal 1, proxy.idempotency_keys.size
    assert_raises(Opgraph::TransportError) { through.usage }
    assert_equal 4, proxy.idempotency_keys.size
  ensure
    proxy&.close
  end

  def test_a_body_that_is_not_json_is_a_transport_error
    proxy = LosingProxy.new(URI(setting("OPGRAPH_URL")), lose: 0, replace_body: "<html>hello</html>")
    through = Opgraph::Client.new(url: proxy.url, api_key: setting("OPGRAPH_API_KEY"))
    error = assert_raises(Opgraph::TransportError) { through.usage }
    assert_kind_of JSON::ParserError, error.cause
  ensure
    proxy&.close
  end

  # Forwards each request to the cloud, one per connection, and drops the
  # answer of the first `lose` ones: the cloud did the work, the caller
  # never heard.
  class LosingProxy
    attr_reader :url

    def initialize(upstream, lose:, replace_body: nil)
      @upstream = upstream
      @lose = lose
      @replace_body = replace_body
      @keys = []
      @lock = Mutex.new
      @server = TCPServer.new("127.0.0.1", 0)
      @url = "http://127.0.0.1:#{@server.addr[1]}"
      @thread = Thread.new { serve }
    end

    # The Idempotency-Key of every request seen (nil when it had none).
    def idempotency_keys
      @lock.synchronize { @keys.dup }
    end

    def close
      @thread.kill
      @server.close
    end

    private

    def serve
      loop do
        connection = @server.accept
        begin
          relay(connection)
        ensure
          connection.close
        end
      end
    end

    def relay(connection)
      method, target = connection.gets.to_s.split(" ")
      headers = {}
      while (line = connection.gets) && line != "\r\n"
        name, value = line.split(":", 2)
        headers[name.downcase] = value.strip
      end
      body = connection.read(headers.fetch("content-length", "0").to_i)
      seen = @lock.synchronize { (@keys << headers["idempotency-key"]).size }
      answer = forward(method, target, headers, body)
      return if seen <= @lose

      text = @replace_body || answer.body.to_s
      connection.write("HTTP/1.1 #{answer.code} X\r\nContent-Type: application/json\r\n" \
                       "Content-Length: #{text.bytesize}\r\nConnection: close\r\n\r\n#{text}")
    end

    def forward(method, target, headers, body)
      request = Net::HTTPGenericRequest.new(method, !body.empty?, method != "HEAD", target)
      %w[authorization content-type idempotency-key].each { |h| request[h] = headers[h] if headers[h] }
      request.body = body unless body.empty?
      Net::HTTP.start(@upstream.host, @upstream.port) { |http| http.request(request) }
    end
  end
end
