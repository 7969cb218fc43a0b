# frozen_string_literal: true

require "json"
require "net/http"
require "openssl"
require "securerandom"
require "time"
require "uri"
require "zlib"

module Opgraph
  # A client of one Opgraph cloud with one credential.
  #
  # Every call returns the answer's JSON (Hashes with string keys, as
  # +JSON.parse+ gives) or raises an {Opgraph::Error}. Calls retry what is
  # safe to retry (see README, "Retries"). A client keeps no connection
  # and no mutable state, so one instance may be shared between threads.
  #
  # @example
  #   client = Opgraph::Client.new # OPGRAPH_URL and OPGRAPH_API_KEY
  #   client.ingest({ "event" => "door.opened", "actor" => "dock-3" })
  #   client.events(event: "door.opened", limit: 10)
  class Client
    DEFAULT_URL = "http://127.0.0.1:8080"
    USER_AGENT = "opgraph-ruby/#{VERSION}"
    # A longer Retry-After (an exhausted monthly quota answers an hour) is
    # raised at once rather than slept through.
    MAX_RETRY_AFTER = 60
    # The first pause after a call that got no answer; it doubles each time,
    # up to MAX_BACKOFF.
    FIRST_BACKOFF = 0.2
    MAX_BACKOFF = 30.0

    # The API's code for a status, for answers that did not come with one (a
    # proxy's page, strict health's report); else "http_<status>". The same
    # table in all four SDKs; a 400 has several codes, so it gets none.
    CODE_OF_STATUS = {
      401 => "unauthorized", 403 => "forbidden", 404 => "not_found", 405 => "method_not_allowed",
      409 => "conflict", 413 => "payload_too_large", 415 => "unsupported_media_type",
      429 => "rate_limited", 500 => "internal", 503 => "unavailable"
    }.freeze

    # What a setting may hold and still count as not given.
    BLANK = /\A[ \t\n\v\f\r]*\z/

    METHODS = {
      "GET" => Net::HTTP::Get, "POST" => Net::HTTP::Post, "PUT" => Net::HTTP::Put,
      "PATCH" => Net::HTTP::Patch, "DELETE" => Net::HTTP::Delete, "HEAD" => Net::HTTP::Head
    }.freeze

    # Everything Net::HTTP raises when no answer came; none of it escapes a
    # call, it becomes a {TransportError}.
    TRANSPORT_FAILURES = [
      Timeout::Error, SystemCallError, SocketError, IOError, OpenSSL::SSL::SSLError,
      Net::ProtocolError, Net::HTTPBadResponse, Zlib::Error
    ].freeze

    # @return [String] the cloud's URL, without a trailing "/"
    attr_reader :url
    # @return [String, nil] the X-Opgraph-Workspace-ID sent, if any
    attr_reader :workspace
    # @return [Numeric] seconds each connect, read and write may take
    attr_reader :timeout
    # @return [Integer] retries after the first attempt
    attr_reader :max_retries

    # @param url [String, nil] the cloud, http:// or https://; default
    #   +OPGRAPH_URL+, else http://127.0.0.1:8080
    # @param api_key [String, nil] an API key or an enterprise token;
    #   default +OPGRAPH_API_KEY+
    # @param workspace [String, nil] sent as X-Opgraph-Workspace-ID, which a
    #   token naming several workspaces needs; default +OPGRAPH_WORKSPACE_ID+
    #
    # An empty +url+, +api_key+ or +workspace+ (or one of only spaces, tabs
    # and line breaks) counts as not given, so its environment variable
    # applies; an empty variable counts as unset too.
    # @param timeout [Numeric] seconds allowed to connect, and to each read
    #   and write of an attempt
    # @param max_retries [Integer] retries after the first attempt (0: none)
    # @raise [ArgumentError] for a URL that is not http(s), a key or
    #   workspace holding line breaks or other control characters, or a
    #   timeout or retry count out of range
    def initialize(url: nil, api_key: nil, workspace: nil, timeout: 30, max_retries: 3)
      url = present(url) || present(ENV["OPGRAPH_URL"]) || DEFAULT_URL
      @uri = base_uri(url)
      @url = @uri.to_s
      @api_key = header_value("api_key", present(api_key) || present(ENV["OPGRAPH_API_KEY"]))
      @workspace = header_value("workspace", present(workspace) || present(ENV["OPGRAPH_WORKSPACE_ID"]))
      unless timeout.is_a?(Numeric) && timeout.positive?
        raise ArgumentError, "timeout must be a positive number of seconds, got #{timeout.inspect}"
      end
      unless max_retries.is_a?(Integer) && max_retries >= 0
        raise ArgumentError, "max_retries must be an Integer >= 0, got #{max_retries.inspect}"
      end

      @timeout = timeout
      @max_retries = max_retries
    end

    # Never shows the key.
    def inspect
      "#<#{self.class.name} url=#{@url.inspect} workspace=#{@workspace.inspect} " \
        "timeout=#{@timeout} max_retries=#{@max_retries}>"
    end

    # Records one event, or a list of them as one all-or-nothing batch (at
    # most 1000). Always sends an Idempotency-Key, so a retry after a lost
    # answer stores nothing twice.
    #
    # @param event_or_events [Hash, Array<Hash>] envelope(s): "event"
    #   (required), "actor", "object", "traceId", "businessId",
    #   "properties", "messageId", "timestamp" (ms), ...
    # @param idempotency_key [String, nil] default: a random one, made once
    #   per call and kept across its retries
    # @return [Hash] {"accepted" => n, "ids" => ["evt_..."]}
    def ingest(event_or_events, idempotency_key: nil)
      body = case event_or_events
             when Hash then event_or_events
             when Array then { "batch" => event_or_events }
             else raise ArgumentError, "ingest takes an event Hash or an Array of them"
             end
      call("POST", "/api/ingest", body: body, idempotency_key: idempotency_key || SecureRandom.uuid)
    end

    # Stored events, newest first.
    #
    # @param from [Integer, nil] earliest, ms since the epoch
    # @param to [Integer, nil] latest, ms since the epoch
    # @param limit [Integer, nil] default 100, at most 1000
    # @return [Array<Hash>] envelopes with their "id" and "receivedAt"
    def events(event: nil, trace_id: nil, business_id: nil, from: nil, to: nil, limit: nil)
      query = { event: event, trace_id: trace_id, business_id: business_id, from: from, to: to, limit: limit }
      listed = call("GET", "/api/events", query: camelize(query))
      return listed["events"] if listed.is_a?(Hash) && listed["events"].is_a?(Array)

      raise TransportError, "GET /api/events: the answer has no \"events\" list"
    end

    # Case-insensitive search over event names, property values and actor
    # and object ids and types.
    #
    # @param query [String] 1 to 200 characters
    # @return [Hash] {"results" => [envelope + "id"], "total" => n, ...}
    def search(query, event: nil, business_id: nil, from: nil, to: nil, limit: nil)
      body = camelize(query: query, event: event, business_id: business_id, from: from, to: to, limit: limit)
      call("POST", "/api/analytics/event-search", body: body)
    end

    # Counts, unique actors and revenue per event name (default: the last
    # 30 days). Option names may be snake_case: +event_name:+, +from:+,
    # +to:+, +interval:+ ("hour" | "day"), +business_id:+,
    # +persist_snapshots:+, +limit:+.
    #
    # @return [Hash] {"metrics" => [...], "totalEvents" => n, "definitions" => [...], ...}
    def metrics(**options)
      call("POST", "/api/metrics/query", body: camelize(options))
    end

    # This period against the one before (default: the last 7 days against
    # the 7 before). Options: +business_id:+, +current:+ and +previous:+
    # ({from:, to:} in ms), +limit:+.
    #
    # @return [Hash] {"current", "previous", "revenueDelta", "eventDiffs",
    #   "newEventTypes", "disappearedEventTypes"}
    def whats_changed(**options)
      call("POST", "/api/analytics/whats-changed", body: camelize(options))
    end

    # A business's health score with its reasons.
    #
    # @param business_id [String] e.g. "default"
    # @return [Hash] {"businessId", "healthScore", "alerts", "nextActions", ...}
    # @raise [ApiError] 404 not_found for an unknown business
    def business_health(business_id, limit: nil)
      call("GET", "/api/businesses/#{path_segment(business_id)}/health", query: camelize(limit: limit))
    end

    # What an agent should know now.
    #
    # @param mode [String, Symbol] "summarize", "recommend_next_actions",
    #   "detect_anomalies" or "proof_gaps"
    # @return [Hash] {"mode", "businessId", "changes", "anomalies",
    #   "missingProofEvents", "nextActions", ...}
    def agent_context(mode, business_id: nil, limit: nil)
      call("POST", "/api/intelligence/agent-context",
           body: camelize(mode: mode.to_s, business_id: business_id, limit: limit))
    end

    # Runs a GraphQL query and returns its data; an answer with errors
    # raises, so partial data is never read by mistake.
    #
    # @param query [String] the GraphQL document
    # @param variables [Hash, nil]
    # @return [Hash] the answer's "data"
    # @raise [ApiError] status 200, code "graphql", with {ApiError#errors}
    def graphql(query, variables: nil)
      answer = call("POST", "/api/graphql", body: camelize(query: query, variables: variables))
      errors = answer.is_a?(Hash) ? answer["errors"] : nil
      if errors.is_a?(Array) && !errors.empty?
        first = errors.first.is_a?(Hash) ? errors.first : {}
        raise ApiError.new(status: 200, code: "graphql", message: first["message"] || "GraphQL error",
                           field: first.dig("extensions", "field"), errors: errors, body: answer)
      end
      unless answer.is_a?(Hash) && answer.key?("data")
        raise TransportError, "POST /api/graphql: the answer has no \"data\""
      end

      answer["data"]
    end

    # Asks governance whether a proposed action may go ahead, and records a
    # receipt. Top-level names may be snake_case (+decision_object_id:+,
    # +authority_grant_id:+, +context_contract_id:+, +proposed_action:+,
    # ...); nested values are sent as given.
    #
    # @param request [Hash]
    # @return [Hash] {"outcome" => "allow" | "escrow" |
    #   "needs_human_approval" | "deny", "receiptId", "checks", "receipt"}
    def enforce(request)
      raise ArgumentError, "enforce takes a Hash" unless request.is_a?(Hash)

      call("POST", "/api/governance/enforce", body: camelize(request))
    end

    # Records a use of a registered trackable by its code. Like {#ingest},
    # always sends an Idempotency-Key, so a retry after a lost answer
    # records the use once.
    #
    # @param code [String] the trackable's code
    # @param event [String, nil] default: the trackable's event name, else
    #   "trackable.used"
    # @param actor [String, Hash, nil] a string or {"type", "id"}
    # @param idempotency_key [String, nil] default: a random one, made once
    #   per call and kept across its retries
    # @return [Hash] {"accepted" => 1, "ids" => ["evt_..."]}
    # @raise [ApiError] 404 not_found for an unknown code
    def track(code, event: nil, properties: nil, actor: nil, timestamp: nil, business_id: nil,
              idempotency_key: nil)
      body = camelize(code: code, event: event, properties: properties, actor: actor,
                      timestamp: timestamp, business_id: business_id)
      call("POST", "/api/track", body: body, idempotency_key: idempotency_key || SecureRandom.uuid)
    end

    # Registers a trackable and returns its code and scan URL.
    #
    # @param kind [String, Symbol] "qr_code", "barcode", "rfid_tag",
    #   "sensor", "robot", "ai_agent", "mcp_server" or "cli_workflow"
    # @param name [String] what it is
    # @param options [Hash] +target_url:+ (required for a QR code),
    #   +event_name:+, +code:+ (an external identifier), +include_qr_svg:+
    # @return [Hash] {"trackable" => {"id", "code", "scanUrl", ...}, "qrSvg"?}
    def create_trackable(kind, name, **options)
      body = camelize(options).merge("kind" => kind.to_s, "name" => name)
      call("POST", "/api/trackables", body: body)
    end

    # The workspace's usage this month.
    #
    # @return [Hash] {"workspaceId", "period", "events" => {"ingested",
    #   "quota", "remaining"}, "apiCalls", "connectors", "agents", "rateLimit"}
    def usage(limit: nil)
      call("GET", "/api/usage", query: camelize(limit: limit))
    end

    # The cloud's readiness; needs no credential.
    #
    # @param strict [Boolean] fail on any failed required check
    # @return [Hash] {"status" => "ok" | "degraded", "version", "checks"}
    # @raise [ApiError] 503 when strict and a required check failed (the
    #   report is {ApiError#body})
    def health(strict: false)
      call("GET", "/api/health", query: strict ? { "strict" => "1" } : nil)
    end

    # Any other API call, with the same headers, errors and retries.
    #
    # @example Create a read-only key
    #   client.request(:post, "/api/keys", body: { name: "dashboard", scopes: ["read"] })
    # @param method [Symbol, String] :get, :post, :put, :patch, :delete or :head
    # @param path [String] starting with "/", e.g. "/api/keys"
    # @param body [Object, nil] sent as JSON
    # @param query [Hash, nil] the query string; nil values are left out
    # @param idempotency_key [String, nil] sent as Idempotency-Key
    # @return [Object, nil] the parsed answer; nil for an empty one (204)
    def request(method, path, body: nil, query: nil, idempotency_key: nil)
      call(method.to_s.upcase, path, body: body, query: query, idempotency_key: idempotency_key)
    end

    private

    # One call with its retries (docs/sdks.md, "Retries"). A call is
    # retry-safe when repeating it cannot store twice: a GET, or a call
    # carrying an idempotency key.
    # - 429 waits the Retry-After sent, whatever the call: the cloud refused
    #   it before doing anything;
    # - 503 waits the Retry-After sent only for a retry-safe call: the store
    #   may have taken a write it could not answer;
    # - a wait over MAX_RETRY_AFTER, or none at all (a strict health 503 is
    #   an answer, not a refusal), is raised at once;
    # - no answer: retried with doubling pauses, only for a retry-safe call;
    # - nothing else is retried.
    def call(method, path, body: nil, query: nil, idempotency_key: nil)
      klass = METHODS.fetch(method) { raise ArgumentError, "unknown HTTP method #{method.inspect}" }
      raise ArgumentError, "path must start with \"/\", got #{path.inspect}" unless path.start_with?("/")

      idempotency_key = header_value("idempotency_key", idempotency_key)
      target = "#{@uri.path}#{path}"
      query = query&.reject { |_, v| v.nil? }
      target += "?#{URI.encode_www_form(query)}" if query && !query.empty?
      payload = body.nil? ? nil : encode(body)
      repeatable = method == "GET" || method == "HEAD" || !idempotency_key.nil?
      attempt = 0
      loop do
        begin
          response = exchange(klass, target, payload, idempotency_key)
        rescue *TRANSPORT_FAILURES => e
          if repeatable && attempt < @max_retries
            sleep([FIRST_BACKOFF * (2**[attempt, 32].min), MAX_BACKOFF].min)
            attempt += 1
            next
          end
          raise TransportError, "#{method} #{path}: #{describe(e)}", cause: e
        end
        status = response.code.to_i
        return answer(method, path, response) if (200..299).cover?(status)

        error = api_error(status, response)
        wait = error.retry_after
        refused = status == 429 || (status == 503 && repeatable)
        if refused && wait && wait <= MAX_RETRY_AFTER && attempt < @max_retries
          sleep(wait)
          attempt += 1
          next
        end
        raise error
      end
    end

    # One attempt on a fresh connection (nothing shared between threads).
    def exchange(klass, target, payload, idempotency_key)
      http = Net::HTTP.new(@uri.host, @uri.port)
      http.use_ssl = @uri.scheme == "https"
      http.open_timeout = @timeout
      http.read_timeout = @timeout
      http.write_timeout = @timeout
      http.ssl_timeout = @timeout
      # Net::HTTP would silently repeat some requests itself; the policy
      # above is the only one.
      http.max_retries = 0
      request = klass.new(target)
      request["Authorization"] = "Bearer #{@api_key}" if @api_key
      request["X-Opgraph-Workspace-ID"] = @workspace if @workspace
      request["Content-Type"] = "application/json"
      request["Accept"] = "application/json"
      request["User-Agent"] = USER_AGENT
      request["Idempotency-Key"] = idempotency_key if idempotency_key
      request.body = payload if payload
      http.start { |connection| connection.request(request) }
    end

    # The JSON of a 2xx answer; nil when it has no body.
    def answer(method, path, response)
      text = response.body
      return nil if text.nil? || text.strip.empty?

      JSON.parse(text)
    rescue JSON::ParserError => e
      raise TransportError, "#{method} #{path}: HTTP #{response.code} with a body that is not JSON " \
                            "(#{snippet(text)})", cause: e
    end

    def api_error(status, response)
      body = begin
        JSON.parse(response.body.to_s)
      rescue JSON::ParserError
        nil
      end
      detail = body.is_a?(Hash) && body["error"].is_a?(Hash) ? body["error"] : {}
      message = detail["message"]
      # A proxy's HTML page still says something useful.
      message ||= "HTTP #{status}: #{snippet(response.body)}" if body.nil? && !response.body.to_s.strip.empty?
      code = detail["code"].is_a?(String) ? detail["code"] : CODE_OF_STATUS.fetch(status, "http_#{status}")
      ApiError.new(status: status, code: code, message: message, field: detail["field"],
                   retry_after: retry_after(response["Retry-After"]), body: body)
    end

    # Retry-After in whole seconds: a number, or an HTTP date.
    def retry_after(value)
      return nil if value.nil?

      value = value.strip
      return value.to_i if value.match?(/\A\d+\z/)

      [(Time.httpdate(value) - Time.now).ceil, 0].max
    rescue ArgumentError
      nil
    end

    def encode(body)
      JSON.generate(body)
    rescue JSON::GeneratorError => e
      raise ArgumentError, "the body cannot be sent as JSON: #{e.message}"
    end

    # Names a Ruby user writes (business_id:) as the API spells them
    # (businessId); nil values are left out so the API applies its defaults.
    def camelize(options)
      options.each_with_object({}) do |(key, value), out|
        next if value.nil?

        out[key.to_s.gsub(/_([a-z\d])/) { Regexp.last_match(1).upcase }] = value
      end
    end

    def path_segment(value)
      text = value.to_s
      raise ArgumentError, "an id must be a non-empty string" if text.empty?

      URI.encode_www_form_component(text).gsub("+", "%20")
    end

    def base_uri(url)
      uri = URI.parse(url.to_s)
      unless %w[http https].include?(uri.scheme) && uri.host && !uri.host.empty?
        raise ArgumentError, "url must be an http:// or https:// URL with a host, got #{url.inspect}"
      end

      uri.path = uri.path.chomp("/")
      uri.query = nil
      uri.fragment = nil
      uri
    rescue URI::InvalidURIError => e
      raise ArgumentError, "url #{url.inspect} is not a URL: #{e.message}"
    end

    # A header value must hold no line break (it would end the header, or
    # smuggle another) nor any other control character.
    def header_value(name, value)
      return nil if value.nil?

      value = value.to_s
      if value.match?(/[\x00-\x1f\x7f]/)
        raise ArgumentError, "#{name} holds a line break or another control character"
      end

      value
    end

    # The setting as given, or nil when it counts as not given: nil, or
    # nothing but spaces, tabs and line breaks (the same rule in all four
    # SDKs), so that OPGRAPH_WORKSPACE_ID= or api_key: "" falls through to
    # the next source instead of sending an empty header.
    def present(value)
      value.nil? || BLANK.match?(value.to_s) ? nil : value
    end

    def describe(error)
      "#{error.class}: #{error.message}"
    end

    def snippet(text)
      text.to_s.strip[0, 200].inspect
    end
  end
end
