# frozen_string_literal: true

# Shared by the suites. They run against real clouds started by
# tests/tests/sdks.rs, which sets OPGRAPH_URL and OPGRAPH_API_KEY (an
# admin key of a fresh cloud) and OPGRAPH_LIMITED_URL and
# OPGRAPH_LIMITED_API_KEY (a cloud allowing one request per second).
# Minitest's autorun exits non-zero when any test fails.

require "minitest/autorun"
require "socket"
require "securerandom"
require "opgraph"

module CloudHelpers
  # A setting from the harness; missing is a failure, not a skip, so a
  # misconfigured run cannot pass by testing nothing.
  def setting(name)
    value = ENV.fetch(name, "")
    flunk "#{name} is not set: run this suite through tests/tests/sdks.rs" if value.empty?
    value
  end

  def client(**settings)
    Opgraph::Client.new(url: setting("OPGRAPH_URL"), api_key: setting("OPGRAPH_API_KEY"), **settings)
  end

  def limited_client(**settings)
    Opgraph::Client.new(url: setting("OPGRAPH_LIMITED_URL"), api_key: setting("OPGRAPH_LIMITED_API_KEY"),
                        **settings)
  end

  # An event name no other test (or earlier run) uses.
  def unique(what)
    "sdk.ruby.#{what}.#{SecureRandom.hex(6)}"
  end

  def assert_api_error(status, code, &block)
    error = assert_raises(Opgraph::ApiError, &block)
    assert_equal status, error.status, error.inspect
    assert_equal code, error.code, error.inspect
    error
  end
end

# A local HTTP server for what a real cloud cannot be made to do on demand
# (a 503, an answer never sent): the n-th request gets the n-th answer of
# its script (the last one repeats), each a raw HTTP answer or nil, which
# closes the connection unanswered. Every request is kept in `requests`,
# as {"method", "path", "headers" (lower-case names), "body"}.
class FakeServer
  attr_reader :url

  def initialize(*script)
    @script = script
    @requests = []
    @lock = Mutex.new
    @server = TCPServer.new("127.0.0.1", 0)
    @url = "http://127.0.0.1:#{@server.addr[1]}"
    @thread = Thread.new { serve }
  end

  # The raw bytes of an answer with a JSON body and extra headers.
  def self.answer(status, body, headers = {})
    text = body.is_a?(String) ? body : JSON.generate(body)
    head = ["HTTP/1.1 #{status} X", "Content-Type: application/json", "Content-Length: #{text.bytesize}",
            "Connection: close"] + headers.map { |name, value| "#{name}: #{value}" }
    "#{head.join("\r\n")}\r\n\r\n#{text}"
  end

  def requests
    @lock.synchronize { @requests.dup }
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
        answer = record(connection)
        connection.write(answer) if answer
      ensure
        connection.close
      end
    end
  end

  def record(connection)
    method, path = connection.gets.to_s.split(" ")
    headers = {}
    while (line = connection.gets) && line != "\r\n"
      name, value = line.split(":", 2)
      headers[name.downcase] = value.strip
    end
    body = connection.read(headers.fetch("content-length", "0").to_i)
    @lock.synchronize do
      @requests << { "method" => method, "path" => path, "headers" => headers, "body" => body }
      @script[[@requests.size, @script.size].min - 1]
    end
  end
end
