# frozen_string_literal: true

require_relative "lib/opgraph/version"

Gem::Specification.new do |spec|
  spec.name = "opgraph"
  spec.version = Opgraph::VERSION
  spec.summary = "Client for the Opgraph cloud API"
  spec.description = "Ingest events, query them, and ask governance from Ruby: " \
                     "retries on rate limits and lost answers, standard library only."
  spec.authors = ["Opgraph"]
  spec.license = "Apache-2.0"
  spec.homepage = "https://example.invalid/opgraph"
  spec.required_ruby_version = ">= 3.0"
  # Listed by hand rather than with `git ls-files`, so the gem builds
  # from an exported tree too.
  spec.files = Dir["lib/**/*.rb"] + ["README.md", "opgraph.gemspec"]
  spec.require_paths = ["lib"]
  spec.metadata["rubygems_mfa_required"] = "true"
end
