//! The first-party SDKs (TypeScript/JavaScript, Python, Go, Ruby) against
//! the real cloud binary: each language's own test suite runs against two
//! clouds started here, one with the default limits and one that answers
//! 429 after a request or two, so retries meet a real `Retry-After`.
//!
//! Each suite reads `OPGRAPH_URL` and `OPGRAPH_API_KEY` (the normal cloud)
//! and `OPGRAPH_LIMITED_URL` and `OPGRAPH_LIMITED_API_KEY` (the
//! rate-limited one). A missing toolchain fails the test: `deploy/test.sh`
//! installs them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use opgraph_tests::Cloud;
use tokio::process::Command;

/// Far above what a suite takes; only bounds a hung one.
const WITHIN: Duration = Duration::from_secs(300);

fn sdk_dir(language: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../cloud/sdk").join(language)
}

/// Runs `program args` in the SDK's folder against fresh clouds and fails
/// with the suite's own output when it does.
async fn suite(language: &str, program: &str, args: &[&str], env: &[(&str, &str)]) {
    let cloud = Cloud::start(&[]).await.unwrap();
    let limited = Cloud::start(&[
        ("OPGRAPH_RATE_LIMIT_RPS", "1".to_owned()),
        ("OPGRAPH_RATE_LIMIT_BURST", "1".to_owned()),
    ])
    .await
    .unwrap();
    let run = Command::new(program)
        .args(args)
        .current_dir(sdk_dir(language))
        .env("OPGRAPH_URL", &cloud.url)
        .env("OPGRAPH_API_KEY", &cloud.key)
        .env("OPGRAPH_LIMITED_URL", &limited.url)
        .env("OPGRAPH_LIMITED_API_KEY", &limited.key)
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(WITHIN, run)
        .await
        .unwrap_or_else(|_| panic!("the {language} suite did not end within {WITHIN:?}"))
        .unwrap_or_else(|e| panic!("`{program}` for the {language} SDK: {e} (is it installed?)"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the {language} SDK's suite failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    // Print the suite's report, so a passing run still shows what ran.
    println!("{stdout}{stderr}");
}

#[tokio::test]
async fn javascript() {
    suite("js", "node", &["--test", "test/"], &[]).await;
}

#[tokio::test]
async fn python() {
    suite("python", "python3", &["-m", "unittest", "discover", "-s", "tests", "-v"], &[]).await;
}

#[tokio::test]
async fn go() {
    // No dependency to fetch: the module uses the standard library only.
    let cache = std::env::temp_dir().join("opgraph-go-cache");
    let cache = cache.to_string_lossy();
    suite(
        "go",
        "go",
        &["test", "-count=1", "-v", "./..."],
        &[("GOPROXY", "off"), ("GOFLAGS", "-mod=mod"), ("GOCACHE", &cache)],
    )
    .await;
}

#[tokio::test]
async fn ruby() {
    suite(
        "ruby",
        "ruby",
        &[
            "-Ilib",
            "-Itest",
            "-e",
            "Dir.glob('test/**/*_test.rb').sort.each { |f| require File.expand_path(f) }",
        ],
        &[],
    )
    .await;
}
