# frozen_string_literal: true

module Opgraph
  # The gem's version, also sent in the User-Agent header.
  VERSION = "0.1.0"
end
