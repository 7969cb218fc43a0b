# frozen_string_literal: true

# Opgraph's Ruby SDK: a client for the Opgraph cloud's HTTP/JSON API.
#
# - {Opgraph::Client} holds the settings and offers one method per API
#   operation applications use most, plus {Opgraph::Client#request} for the
#   rest; answers are the parsed JSON (Hashes with string keys).
# - {Opgraph::Error} is what every call raises: {Opgraph::ApiError} when the
#   cloud answered outside 2xx, {Opgraph::TransportError} when no usable
#   answer came.
#
# The contract it shares with the JavaScript, Python and Go SDKs is
# docs/sdks.md in the Opgraph repository.
module Opgraph
end

require_relative "opgraph/version"
require_relative "opgraph/errors"
require_relative "opgraph/client"
