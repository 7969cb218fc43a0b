# frozen_string_literal: true

module Opgraph
  # What every call of {Client} raises; rescue this to catch both kinds.
  class Error < StandardError; end

  # The cloud answered, outside 2xx (or a GraphQL answer carried `errors`).
  #
  # @example
  #   begin
  #     client.ingest({ "batch" => [] })
  #   rescue Opgraph::ApiError => e
  #     e.status # => 400
  #     e.code   # => "validation_failed"
  #     e.field  # => "batch"
  #   end
  class ApiError < Error
    # @return [Integer] the HTTP status (200 for a GraphQL error)
    attr_reader :status
    # @return [String] the API's snake_case code, e.g. "rate_limited";
    #   "graphql" for GraphQL errors. An answer without the API's error
    #   shape gets the API's code for its status ("unavailable" for 503),
    #   else "http_<status>" ("http_502").
    attr_reader :code
    # @return [String, nil] JSON path of the offending input, e.g. "batch[3].event"
    attr_reader :field
    # @return [Integer, nil] seconds the cloud asked to wait (Retry-After)
    attr_reader :retry_after
    # @return [Array<Hash>, nil] the GraphQL errors, for code "graphql"
    attr_reader :errors
    # @return [Object, nil] the parsed body, e.g. the report of a failed
    #   strict health check
    attr_reader :body

    def initialize(status:, code: nil, message: nil, field: nil, retry_after: nil, errors: nil, body: nil)
      @status = status
      @code = code
      @api_message = message || "HTTP #{status}"
      @field = field
      @retry_after = retry_after
      @errors = errors
      @body = body
      super(@api_message)
    end

    # @return [String] the API's message, text for a human
    def message
      @api_message
    end

    # Status, code and field beside the message: what Ruby 3.2 and later
    # print for an uncaught error, and what {#inspect} shows.
    # @return [String] e.g. "HTTP 400 validation_failed: ... (field batch[1].event)"
    def detailed_message(**)
      sentence = +"HTTP #{status}"
      sentence << " #{code}" if code
      sentence << ": #{message}"
      sentence << " (field #{field})" if field
      sentence << " (retry after #{retry_after} s)" if retry_after
      sentence
    end

    def inspect
      "#<#{self.class.name} #{detailed_message}>"
    end
  end

  # No usable answer came: refused connection, timeout, TLS failure, or a
  # body that is not the JSON the API sends. The low-level exception is
  # {#cause}.
  class TransportError < Error; end
end
