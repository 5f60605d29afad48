//! The web console at `/`: runs, one run's step graph, connections.
//!
//! Plain HTML, CSS and JavaScript embedded in the binary, so there is nothing
//! to build or install. The shell holds no data and is served without the
//! token; the page asks for the token once, keeps it in `sessionStorage` and
//! sends it as `Authorization: Bearer` with every data request (`/rpc` and
//! the event streams, which it reads with `fetch`, since `EventSource` cannot
//! send headers). The token never goes into a URL, where logs would keep it.
//!
//! Every response carries a strict Content-Security-Policy (scripts and styles
//! from this origin only, nothing inline), `nosniff` and `no-referrer`.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// What the page may load and connect to: only this origin, no inline code,
/// no frames, no forms posted anywhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
const ICON_SVG: &str = include_str!("assets/icon.svg");

/// The console's routes: `/` and its assets under `/console/`. They need no
/// token (the data they show comes from `/rpc` and `/events`, which do).
pub fn router() -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/console/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/console/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route(
            "/console/icon.svg",
            get(|| async { asset("image/svg+xml", ICON_SVG) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // A new binary may bring new assets: ask each time (they are small).
        (header::CACHE_CONTROL, "no-cache"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn the_shell_and_its_assets_carry_the_security_headers() {
        for (path, content_type) in [
            ("/", "text/html; charset=utf-8"),
            ("/console/app.js", "text/javascript; charset=utf-8"),
            ("/console/app.css", "text/css; charset=utf-8"),
            ("/console/icon.svg", "image/svg+xml"),
        ] {
            let request = Request::get(path).body(Body::empty()).unwrap();
            let response = router().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            let headers = response.headers();
            assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
            assert_eq!(
                headers[header::CONTENT_SECURITY_POLICY],
                CONTENT_SECURITY_POLICY
            );
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert_eq!(headers[header::REFERRER_POLICY], "no-referrer");
        }
    }

    #[test]
    fn the_page_has_no_inline_script_or_style() {
        // The policy would block them; keep the page honest about it.
        assert!(!INDEX_HTML.contains("<script>"));
        assert!(!INDEX_HTML.contains("style="));
        assert!(!INDEX_HTML.contains("<style"));
        assert!(INDEX_HTML.contains(r#"<script src="/console/app.js" defer></script>"#));
    }
}
