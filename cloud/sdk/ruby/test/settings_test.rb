# frozen_string_literal: true

require "test_helper"

# Settings are checked when the client is made, before any request.
class SettingsTest < Minitest::Test
  include CloudHelpers

  def test_a_url_that_is_not_http_is_refused
    ["ftp://example.com", "example.com:8080", "http://", "not a url"].each do |url|
      error = assert_raises(ArgumentError) { Opgraph::Client.new(url: url, api_key: "og_x") }
      assert_includes error.message, "url", url
    end
  end

  def test_line_breaks_in_headers_are_refused
    error = assert_raises(ArgumentError) { Opgraph::Client.new(api_key: "og_x\r\nX-Evil: 1") }
    assert_includes error.message, "api_key"
    error = assert_raises(ArgumentError) { Opgraph::Client.new(api_key: "og_x", workspace: "ws_a\nb") }
    assert_includes error.message, "workspace"
  end

  def test_timeout_and_retries_are_checked
    assert_raises(ArgumentError) { Opgraph::Client.new(api_key: "og_x", timeout: 0) }
    assert_raises(ArgumentError) { Opgraph::Client.new(api_key: "og_x", max_retries: -1) }
  end

  # Sets the variables for the block, then puts back what was there.
  def with_env(values)
    saved = values.keys.to_h { |name| [name, ENV.fetch(name, nil)] }
    values.each { |name, value| ENV[name] = value }
    yield
  ensure
    saved.each { |name, value| ENV[name] = value }
  end

  def test_the_url_and_key_come_from_the_environment
    from_env = Opgraph::Client.new
    assert_equal setting("OPGRAPH_URL").chomp("/"), from_env.url
    assert_equal 3, from_env.max_retries
    assert_equal 30, from_env.timeout
    refute_includes from_env.inspect, setting("OPGRAPH_API_KEY")
    assert_equal "ok", from_env.health["status"]
  end

  def test_the_workspace_comes_from_opgraph_workspace_id
    server = FakeServer.new(FakeServer.answer(200, { "events" => [] }))
    saved = ENV.fetch("OPGRAPH_WORKSPACE_ID", nil)
    ENV["OPGRAPH_WORKSPACE_ID"] = "ws_from_env"
    from_env = Opgraph::Client.new(url: server.url, api_key: "og_x")
    given = Opgraph::Client.new(url: server.url, api_key: "og_x", workspace: "ws_given")
    assert_equal "ws_from_env", from_env.workspace
    from_env.events
    given.events
    assert_equal %w[ws_from_env ws_given], server.requests.map { |r| r["headers"]["x-opgraph-workspace-id"] }
    # The real cloud sees it too: another workspace is refused.
    ENV["OPGRAPH_WORKSPACE_ID"] = "ws_someone_else"
    assert_api_error(403, "forbidden") { client.events(limit: 1) }
  ensure
    ENV["OPGRAPH_WORKSPACE_ID"] = saved
    server&.close
  end

  def test_an_empty_setting_counts_as_not_given
    server = FakeServer.new(FakeServer.answer(200, { "events" => [] }))
    blanks = ["", "   ", "\t\r\n"]
    with_env("OPGRAPH_URL" => "#{server.url}/", "OPGRAPH_API_KEY" => "og_from_env",
             "OPGRAPH_WORKSPACE_ID" => "ws_from_env") do
      blanks.each do |blank|
        opgraph = Opgraph::Client.new(url: blank, api_key: blank, workspace: blank)
        assert_equal [server.url, "ws_from_env"], [opgraph.url, opgraph.workspace], blank.inspect
        opgraph.events
      end
    end
    sent = server.requests.map { |r| r["headers"].values_at("authorization", "x-opgraph-workspace-id") }
    assert_equal [["Bearer og_from_env", "ws_from_env"]] * blanks.size, sent
  ensure
    server&.close
  end

  def test_an_empty_variable_counts_as_unset
    server = FakeServer.new(FakeServer.answer(200, { "events" => [] }))
    ["", " "].each do |empty|
      with_env("OPGRAPH_URL" => empty, "OPGRAPH_API_KEY" => empty, "OPGRAPH_WORKSPACE_ID" => empty) do
        bare = Opgraph::Client.new(url: empty, api_key: empty, workspace: empty)
        assert_equal ["http://127.0.0.1:8080", nil], [bare.url, bare.workspace]
        Opgraph::Client.new(url: server.url, api_key: empty, workspace: empty).events
      end
    end
    # No key or workspace header at all, not an empty one.
    assert_equal 2, server.requests.size
    server.requests.each do |request|
      refute_includes request["headers"].keys, "authorization"
      refute_includes request["headers"].keys, "x-opgraph-workspace-id"
    end
  ensure
    server&.close
  end

  def test_a_trailing_slash_is_dropped
    assert_equal "https://cloud.example.com/opgraph",
                 Opgraph::Client.new(url: "https://cloud.example.com/opgraph/", api_key: "og_x").url
  end
end
