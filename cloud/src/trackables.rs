//! Trackables without I/O: the kinds, identifier codes (generated and
//! external), URL checks, the scan URL and its QR code.
//!
//! A trackable has two codes (docs/trackables.md):
//! - `code`, unique per workspace: what events carry in `trackable.code`
//!   and what `POST /api/track` names. Generated, or an external identifier
//!   (an EPC, a GTIN) registered as it is printed or encoded.
//! - the scan code, unique across all workspaces: the last segment of the
//!   public `scanUrl` (`{public_url}/r/{scan_code}`), which must find its
//!   trackable without a credential and so without a workspace. For a
//!   generated code the two are the same string; an external code gets a
//!   generated scan code, since two workspaces may register the same EPC.

use qrcode::render::svg;
use qrcode::{EcLevel, QrCode};
use rand::Rng;

/// What a trackable identifies (interface spec 2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrackableKind {
    QrCode,
    Barcode,
    RfidTag,
    Sensor,
    Robot,
    AiAgent,
    McpServer,
    CliWorkflow,
}

impl TrackableKind {
    pub const ALL: [TrackableKind; 8] = [
        TrackableKind::QrCode,
        TrackableKind::Barcode,
        TrackableKind::RfidTag,
        TrackableKind::Sensor,
        TrackableKind::Robot,
        TrackableKind::AiAgent,
        TrackableKind::McpServer,
        TrackableKind::CliWorkflow,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TrackableKind::QrCode => "qr_code",
            TrackableKind::Barcode => "barcode",
            TrackableKind::RfidTag => "rfid_tag",
            TrackableKind::Sensor => "sensor",
            TrackableKind::Robot => "robot",
            TrackableKind::AiAgent => "ai_agent",
            TrackableKind::McpServer => "mcp_server",
            TrackableKind::CliWorkflow => "cli_workflow",
        }
    }

    /// Exact and case-sensitive, as on the wire.
    pub fn parse(text: &str) -> Option<TrackableKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// `qr_code, barcode, ...` for error messages.
    pub fn listing() -> String {
        Self::ALL.map(TrackableKind::as_str).join(", ")
    }
}

/// Characters of generated codes: lower-case Crockford base32 (no `i`, `l`,
/// `o`, `u`), so a code survives being read aloud or retyped and is safe in
/// a URL path as it is.
const CODE_ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
/// Length of generated codes: 50 random bits. A collision is detected by the
/// store's unique index and answered with a fresh code.
pub const GENERATED_CODE_LEN: usize = 10;
/// Longest external code: a 496-bit EPC is 124 hex digits; EPC URNs
/// (`urn:epc:id:sgtin:0614141.812345.6789`) are shorter.
pub const MAX_EXTERNAL_CODE_LEN: usize = 128;
/// Longest scan code accepted in a `/r/{code}` path, before any lookup.
const MAX_SCAN_CODE_LEN: usize = 64;
/// Longest `targetUrl`: what browsers and QR scanners handle without trouble.
pub const MAX_TARGET_URL_LEN: usize = 2048;
/// Longest public base URL, so that the scan URL still fits a small QR code.
pub const MAX_PUBLIC_URL_LEN: usize = 200;

/// A fresh random code (also used as a scan code).
pub fn generate_code() -> String {
    let mut rng = rand::rng();
    (0..GENERATED_CODE_LEN)
        .map(|_| char::from(CODE_ALPHABET[rng.random_range(0..CODE_ALPHABET.len())]))
        .collect()
}

/// An external identifier as it is printed or encoded: 1 to 128 of
/// `A-Z a-z 0-9 . _ : -` (EPC hex, EPC URNs, GTINs, serials). Matching is
/// exact: register an EPC in the case its readers report it.
pub fn check_external_code(code: &str) -> Result<(), String> {
    if code.is_empty() || code.len() > MAX_EXTERNAL_CODE_LEN {
        return Err(format!("`code` must be 1 to {MAX_EXTERNAL_CODE_LEN} characters"));
    }
    if let Some(bad) =
        code.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(format!(
            "`code` may hold only letters, digits, `.`, `_`, `:` and `-`, not {bad:?}"
        ));
    }
    Ok(())
}

/// Whether a `/r/{code}` path segment can be a scan code at all. Checked
/// before any lookup, so that percent-decoded slashes, dots, NULs and
/// oversized input never reach the store.
pub fn is_scan_code(segment: &str) -> bool {
    !segment.is_empty()
        && segment.len() <= MAX_SCAN_CODE_LEN
        && segment.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A URL a browser may be sent to: absolute `http` or `https` with a host,
/// no credentials, no whitespace, control characters or backslashes, at
/// most [`MAX_TARGET_URL_LEN`] bytes. Checked on the text as sent (which is
/// what is stored and put in `Location`) and as a WHATWG URL parser, such as
/// a browser's, reads it.
pub fn check_target_url(text: &str) -> Result<(), String> {
    check_http_url(text, MAX_TARGET_URL_LEN)
}

/// The configured public base: like a target URL, at most
/// [`MAX_PUBLIC_URL_LEN`] bytes, and without query or fragment (a path is
/// allowed, for a service mounted under a prefix).
pub fn check_public_base_url(text: &str) -> Result<(), String> {
    check_http_url(text, MAX_PUBLIC_URL_LEN)?;
    if text.contains(['?', '#']) {
        return Err("must not have a query or fragment".into());
    }
    Ok(())
}

fn check_http_url(text: &str, max_len: usize) -> Result<(), String> {
    if text.len() > max_len {
        return Err(format!("must be at most {max_len} bytes"));
    }
    let lower = text.get(..8).unwrap_or(text).to_ascii_lowercase();
    let authority = match lower.starts_with("https://") {
        true => &text[8..],
        false if lower.starts_with("http://") => &text[7..],
        false => return Err("must be an absolute http:// or https:// URL".into()),
    };
    // A browser reads `https:///x` as host `x`: refuse what is not literal.
    if authority.is_empty() || authority.starts_with(['/', '?', '#']) {
        return Err("must name a host".into());
    }
    if text.chars().any(|c| c.is_control() || c.is_whitespace() || c == '\\') {
        return Err("must not contain whitespace, control characters or backslashes".into());
    }
    let url = url::Url::parse(text).map_err(|e| format!("is not a valid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("must be an absolute http:// or https:// URL".into());
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("must name a host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry credentials (`user@host`)".into());
    }
    Ok(())
}

/// `{base}/r/{scan_code}`.
pub fn scan_url(public_base: &str, scan_code: &str) -> String {
    format!("{}/r/{scan_code}", public_base.trim_end_matches('/'))
}

/// A QR code of `data` as an SVG element that starts with `<svg`: error
/// correction M (15% of the symbol may be damaged), quiet zone included, at
/// least 256 units wide. Without the XML declaration the renderer puts
/// first, so that it can be placed inline in an HTML page as it is, and
/// still opens as a `.svg` file.
pub fn qr_svg(data: &str) -> Result<String, String> {
    let code = QrCode::with_error_correction_level(data.as_bytes(), EcLevel::M)
        .map_err(|e| format!("cannot encode a QR code: {e}"))?;
    let document = code
        .render::<svg::Color<'_>>()
        .min_dimensions(256, 256)
        .dark_color(svg::Color("#000000"))
        .light_color(svg::Color("#ffffff"))
        .build();
    let start = document.find("<svg").ok_or("the QR renderer wrote no <svg> element")?;
    Ok(document[start..].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_list() {
        for kind in TrackableKind::ALL {
            assert_eq!(TrackableKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(TrackableKind::parse("QR_CODE"), None);
        assert_eq!(TrackableKind::parse("nfc_tag"), None);
        assert_eq!(
            TrackableKind::listing(),
            "qr_code, barcode, rfid_tag, sensor, robot, ai_agent, mcp_server, cli_workflow"
        );
    }

    #[test]
    fn generated_codes_are_short_url_safe_and_scan_codes() {
        let a = generate_code();
        assert_eq!(a.len(), GENERATED_CODE_LEN);
        assert!(is_scan_code(&a), "{a}");
        assert!(check_external_code(&a).is_ok());
        assert_ne!(a, generate_code());
    }

    #[test]
    fn external_codes() {
        for good in [
            "3034F87E5C0000400000012A",
            "09506000134352",
            "urn:epc:id:sgtin:0614141.812345.6789",
            "SN-42_a",
        ] {
            assert!(check_external_code(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "a/b", "ä", "<x>", &"9".repeat(129)] {
            assert!(check_external_code(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scan_code_guard_refuses_path_tricks() {
        for bad in ["", "..", "a/b", "a%2Fb", "a.b", "a\0b", "ä", &"a".repeat(65)] {
            assert!(!is_scan_code(bad), "{bad:?}");
        }
        assert!(is_scan_code("k3x9m2q7vw"));
    }

    #[test]
    fn target_urls() {
        for good in [
            "https://example.com",
            "http://example.com:8080/p?q=1#f",
            "HTTPS://Example.com/a%20b",
            "https://[::1]/x",
            "https://shop.example/caf%C3%A9",
        ] {
            assert!(check_target_url(good).is_ok(), "{good}");
        }
        for bad in [
            "javascript:alert(1)",
            "data:text/html,<script>alert(1)</script>",
            "/relative/path",
            "//example.com/x",
            "example.com",
            "ftp://example.com/file",
            "https://",
            "https:///path",
            "https://user:pw@example.com/",
            "https://google.com@evil.example/",
            "https://exa mple.com/",
            "https://example.com/\nLocation: x",
            "https:\\\\evil.example",
            " https://example.com",
            &format!("https://example.com/{}", "a".repeat(MAX_TARGET_URL_LEN)),
        ] {
            assert!(check_target_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn public_base_joins_without_double_slash() {
        assert!(check_public_base_url("https://go.example.com/").is_ok());
        assert!(check_public_base_url("https://example.com/links").is_ok());
        assert!(check_public_base_url("https://go.example.com/?x=1").is_err());
        assert!(check_public_base_url("https://go.example.com/#top").is_err());
        assert_eq!(scan_url("https://go.example.com/", "abc"), "https://go.example.com/r/abc");
        assert_eq!(scan_url("http://127.0.0.1:9", "abc"), "http://127.0.0.1:9/r/abc");
    }

    /// Reads the modules back out of the SVG `qr_svg` writes (a background
    /// `rect`, then one `path` of `M{x} {y}h{w}v{h}H{x}V{y}` rectangles) into
    /// a bitmap.
    fn rasterise(svg: &str) -> (usize, usize, Vec<bool>) {
        let attr = |name: &str| -> usize {
            let start = svg.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            let end = start + svg[start..].find('"').unwrap();
            svg[start..end].parse().unwrap()
        };
        let (width, height) = (attr("width"), attr("height"));
        let mut dark = vec![false; width * height];
        let d_start = svg.find(" d=\"").unwrap() + 4;
        let d = &svg[d_start..d_start + svg[d_start..].find('"').unwrap()];
        for rect in d.split('M').filter(|r| !r.is_empty()) {
            let numbers: Vec<usize> = rect
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            let [x, y, w, h, ..] = numbers[..] else { panic!("bad rect {rect}") };
            for row in y..y + h {
                for col in x..x + w {
                    dark[row * width + col] = true;
                }
            }
        }
        (width, height, dark)
    }

    #[test]
    fn qr_svg_decodes_to_the_scan_url() {
        let url = scan_url("https://go.example.com", &generate_code());
        let svg = qr_svg(&url).unwrap();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "{svg}");
        let (width, height, dark) = rasterise(&svg);
        assert!(width >= 256 && height >= 256);
        let mut image = rqrr::PreparedImage::prepare_from_greyscale(width, height, |x, y| {
            if dark[y * width + x] { 0 } else { 255 }
        });
        let grids = image.detect_grids();
        assert_eq!(grids.len(), 1);
        let (_, content) = grids[0].decode().unwrap();
        assert_eq!(content, url);
    }

    #[test]
    fn qr_svg_refuses_what_does_not_fit() {
        assert!(qr_svg(&"x".repeat(4000)).is_err());
    }
}
