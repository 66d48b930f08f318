//! Enough of the W3C WebDriver protocol to drive Debian's chromium through
//! chromedriver, over plain HTTP and JSON.

use std::time::Duration;

/// Enough of the WebDriver protocol (W3C, over HTTP and JSON) to drive
/// Debian's chromium through chromedriver: no client crate needed.
pub struct Browser {
    http: reqwest::Client,
    base: String,
    session: String,
    driver: std::process::Child,
}

/// The key W3C WebDriver names a found element by.
pub const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    pub async fn start() -> Browser {
        let chromedriver = std::env::var("SHEPHERD_CHROMEDRIVER")
            .unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        let chromium =
            std::env::var("SHEPHERD_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        assert!(
            std::path::Path::new(&chromedriver).exists()
                && std::path::Path::new(&chromium).exists(),
            "{chromedriver} or {chromium} missing: run the suite with scripts/test (it installs \
             Debian's chromium and chromium-driver), or set SHEPHERD_CHROMEDRIVER and SHEPHERD_CHROMIUM"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = std::process::Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let started = std::time::Instant::now();
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let created: serde_json::Value = http
            .post(format!("{base}/session"))
            .json(&serde_json::json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--window-size=1280,1000"]
                }
            }}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_string();
        let browser = Browser {
            http,
            base,
            session,
            driver,
        };
        // A click that submits a form returns before the next page has
        // loaded (a POST, a redirect, then the page): finding an element
        // waits up to this long for it to appear, as a person would.
        browser
            .call(
                reqwest::Method::POST,
                "/timeouts",
                serde_json::json!({ "implicit": 10_000 }),
            )
            .await;
        browser
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
        self.try_call(method, path, body)
            .await
            .unwrap_or_else(|error| panic!("WebDriver {path}: {error}"))
    }

    /// The call's value, or the error WebDriver answered with.
    async fn try_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, serde_json::Value> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method, url);
        if !body.is_null() {
            request = request.json(&body);
        }
        let answer: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
        match answer["value"].get("error") {
            Some(_) => Err(answer["value"].clone()),
            None => Ok(answer["value"].clone()),
        }
    }

    pub async fn goto(&self, url: &str) {
        self.call(
            reqwest::Method::POST,
            "/url",
            serde_json::json!({ "url": url }),
        )
        .await;
    }

    pub async fn find(&self, css: &str) -> String {
        let found = self
            .call(
                reqwest::Method::POST,
                "/element",
                serde_json::json!({"using": "css selector", "value": css}),
            )
            .await;
        found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("{css}: {found}"))
            .to_string()
    }

    /// Clicks something that does not leave the page (an option, a box).
    pub async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            serde_json::json!({}),
        )
        .await;
    }

    /// Clicks a link or a form's button and waits until the page it was
    /// on has gone. The click returns before the next page has loaded (a
    /// POST, a redirect, then the page), and the old page holds elements
    /// of the same names: reading at once could read the old page, or an
    /// element of it that is gone by the time its text is asked for.
    pub async fn click_to_leave(&self, css: &str) {
        let old_page = self.find("html").await;
        self.click(css).await;
        let started = std::time::Instant::now();
        loop {
            let probe = self
                .try_call(
                    reqwest::Method::GET,
                    &format!("/element/{old_page}/name"),
                    serde_json::Value::Null,
                )
                .await;
            match probe {
                Err(error) if error["error"] == "stale element reference" => return,
                // Chromium's word for the same, caught mid-navigation: the
                // old page's root is no longer in the document.
                Err(error)
                    if error["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("does not belong to the document")) =>
                {
                    return;
                }
                Err(error) => panic!("waiting for {css} to leave the page: {error}"),
                Ok(_) => {}
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "clicking {css} did not leave the page"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What a person reads in the element: its rendered text. The status
    /// page reloads itself every few seconds, so an element found just
    /// before a reload is found again on the new page.
    pub async fn text(&self, css: &str) -> String {
        for _ in 0..5 {
            let id = self.find(css).await;
            match self
                .try_call(
                    reqwest::Method::GET,
                    &format!("/element/{id}/text"),
                    serde_json::Value::Null,
                )
                .await
            {
                Ok(text) => return text.as_str().unwrap().to_string(),
                Err(error) if error["error"] == "stale element reference" => continue,
                Err(error) => panic!("reading {css}: {error}"),
            }
        }
        panic!("{css} went stale five times over")
    }

    pub async fn type_text(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            serde_json::json!({ "text": text }),
        )
        .await;
    }

    pub async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", serde_json::Value::Null)
            .await
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Makes the pages think the system asks for a dark theme (Chromium's
    /// DevTools command through chromedriver), or the light one again.
    pub async fn dark(&self, on: bool) {
        self.call(
            reqwest::Method::POST,
            "/goog/cdp/execute",
            serde_json::json!({
                "cmd": "Emulation.setEmulatedMedia",
                "params": {"features": [{
                    "name": "prefers-color-scheme",
                    "value": if on { "dark" } else { "light" }
                }]}
            }),
        )
        .await;
    }

    /// Makes the page a phone's (390 × 844 CSS pixels, touch), or the
    /// window's again.
    pub async fn phone(&self, on: bool) {
        let (cmd, params) = if on {
            (
                "Emulation.setDeviceMetricsOverride",
                serde_json::json!({"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true}),
            )
        } else {
            (
                "Emulation.clearDeviceMetricsOverride",
                serde_json::json!({}),
            )
        };
        self.call(
            reqwest::Method::POST,
            "/goog/cdp/execute",
            serde_json::json!({"cmd": cmd, "params": params}),
        )
        .await;
    }

    /// The computed value of a CSS property of the first element `css`
    /// matches.
    pub async fn style(&self, css: &str, property: &str) -> String {
        let id = self.find(css).await;
        self.call(
            reqwest::Method::GET,
            &format!("/element/{id}/css/{property}"),
            serde_json::Value::Null,
        )
        .await
        .as_str()
        .unwrap()
        .to_string()
    }

    /// Runs `script` in the page and returns what it returns.
    pub async fn script(&self, script: &str) -> serde_json::Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            serde_json::json!({"script": script, "args": []}),
        )
        .await
    }

    pub async fn screenshot(&self, name: &str) {
        use base64::Engine;
        let png = self
            .call(reqwest::Method::GET, "/screenshot", serde_json::Value::Null)
            .await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
        // Kept in docs/ when asked for (SHEPHERD_SCREENSHOTS=1), so a run
        // does not rewrite tracked files by accident.
        if std::env::var_os("SHEPHERD_SCREENSHOTS").is_some() {
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/screenshots");
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(format!("{dir}/{name}.png"), bytes).unwrap();
        }
    }

    pub async fn quit(mut self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
