//! The first-party SDKs (TypeScript/JavaScript, Python, Go, Ruby) against
//! the real cloud binary: each language's own test suite runs against two
//! clouds started here, one with the default limits and one that answers
//! 429 after a request or two, so retries meet a real `Retry-After`.
//!
//! Each suite reads `OPGRAPH_URL` and `OPGRAPH_API_KEY` (the normal cloud)
//! and `OPGRAPH_LIMITED_URL` and `OPGRAPH_LIMITED_API_KEY` (the
//! rate-limited one). A missing toolchain fails the test: `deploy/test.sh`
//! installs them.
//!
//! The JavaScript SDK's `index.d.ts` is written by hand, so the TypeScript
//! compiler checks it too, against `types/check.ts`; that needs no cloud.
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
    let mut command = Command::new(program);
    command
        .env("OPGRAPH_URL", &cloud.url)
        .env("OPGRAPH_API_KEY", &cloud.key)
        .env("OPGRAPH_LIMITED_URL", &limited.url)
        .env("OPGRAPH_LIMITED_API_KEY", &limited.key)
        .envs(env.iter().copied());
    let report = run(language, command, args).await;
    // Print the suite's report, so a passing run still shows what ran.
    println!("{report}");
}

/// Runs `program args` in the SDK's folder, with no cloud: for checks that
/// need none.
async fn check(language: &str, program: &str, args: &[&str]) {
    run(language, Command::new(program), args).await;
}

/// Runs `command args` in the SDK's folder and fails with its own output
/// when it fails; else returns that output.
async fn run(language: &str, mut command: Command, args: &[&str]) -> String {
    let program = command.as_std().get_program().to_string_lossy().into_owned();
    let run = command.args(args).current_dir(sdk_dir(language)).kill_on_drop(true).output();
    let output = tokio::time::timeout(WITHIN, run)
        .await
        .unwrap_or_else(|_| {
            panic!("`{program}` for the {language} SDK did not end within {WITHIN:?}")
        })
        .unwrap_or_else(|e| panic!("`{program}` for the {language} SDK: {e} (is it installed?)"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "`{program} {}` failed for the {language} SDK ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        args.join(" "),
        output.status
    );
    format!("{stdout}{stderr}")
}

#[tokio::test]
async fn javascript() {
    suite("js", "node", &["--test", "test/"], &[]).await;
}

/// Compiles `types/check.ts`, which uses every export, call, option and error
/// of the hand-written `index.d.ts` as the README does (its examples
/// included) and holds `@ts-expect-error` lines for misuse, so that the
/// declarations can neither refuse what the README shows nor accept what
/// the cloud refuses. Compiled only (`noEmit`), never run.
#[tokio::test]
async fn typescript_declarations() {
    check("js", "tsc", &["-p", "types/tsconfig.json"]).await;
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
