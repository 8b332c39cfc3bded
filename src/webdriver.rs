//! A minimal W3C WebDriver client for ChromeDriver and Debian's headless Chromium: the dashboard's
//! browser test and `windfall bench dashboard --browser` drive real pages with it.
//!
//! Owns starting `chromedriver` on a loopback port and one browser session. Must not be used to
//! reach anything but 127.0.0.1.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use serde_json::{Value, json};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Whether `chromedriver` and Chromium are installed.
pub fn available() -> bool {
    Command::new("chromedriver")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
        && Path::new("/usr/bin/chromium").exists()
}

/// A running `chromedriver`, killed on drop.
pub struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser session.
pub struct Browser {
    http: reqwest::Client,
    session: String,
}

impl Driver {
    /// Starts `chromedriver` and a headless Chromium session (1440 x 1000) that saves downloads
    /// to `downloads` when given.
    pub async fn start(downloads: Option<&Path>) -> Result<(Driver, Browser)> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting chromedriver (Debian package chromium-driver)")?;
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let http = reqwest::Client::new();
        let started = Instant::now();
        loop {
            if let Ok(r) = http.get(format!("{}/status", driver.url)).send().await
                && r.json::<Value>()
                    .await
                    .is_ok_and(|v| v["value"]["ready"] == true)
            {
                break;
            }
            if started.elapsed() > Duration::from_secs(20) {
                bail!("chromedriver did not become ready in 20 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut options = json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-extensions", "--no-first-run",
                     "--window-size=1440,1000"],
        });
        if let Some(dir) = downloads {
            options["prefs"] = json!({ "download.default_directory": dir.display().to_string(),
                                       "download.prompt_for_download": false });
        }
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": options } } });
        let response: Value = http
            .post(format!("{}/session", driver.url))
            .json(&capabilities)
            .send()
            .await?
            .json()
            .await?;
        let Some(id) = response["value"]["sessionId"].as_str() else {
            bail!("chromedriver refused a session: {response}");
        };
        let session = format!("{}/session/{id}", driver.url);
        Ok((driver, Browser { http, session }))
    }
}

impl Browser {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let url = format!("{}{path}", self.session);
        let mut request = self.http.request(method, &url);
        if let Some(b) = body {
            request = request.json(&b);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("WebDriver {path}"))?;
        let status = response.status();
        let value: Value = response
            .json()
            .await
            .with_context(|| format!("WebDriver {path}"))?;
        if !status.is_success() {
            bail!("WebDriver {path}: {status} {}", value["value"]["message"]);
        }
        Ok(value["value"].clone())
    }

    /// Opens `url` and waits for the load event.
    pub async fn go(&self, url: &str) -> Result<()> {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await
            .map(|_| ())
    }

    async fn find(&self, css: &str) -> Result<String> {
        let v = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await?;
        v[ELEMENT]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("no element `{css}`"))
    }

    /// How many elements match `css`.
    pub async fn count(&self, css: &str) -> Result<usize> {
        let v = self
            .call(
                reqwest::Method::POST,
                "/elements",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await?;
        Ok(v.as_array().map_or(0, Vec::len))
    }

    /// The rendered text of the first element matching `css`.
    pub async fn text(&self, css: &str) -> Result<String> {
        let id = self.find(css).await?;
        let v = self
            .call(reqwest::Method::GET, &format!("/element/{id}/text"), None)
            .await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// Clicks the first element matching `css`.
    pub async fn click(&self, css: &str) -> Result<()> {
        let id = self.find(css).await?;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await
        .map(|_| ())
    }

    /// Types `text` into the first element matching `css`.
    pub async fn type_into(&self, css: &str, text: &str) -> Result<()> {
        let id = self.find(css).await?;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .await
        .map(|_| ())
    }

    /// The current page's URL.
    pub async fn current_url(&self) -> Result<String> {
        let v = self.call(reqwest::Method::GET, "/url", None).await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// Milliseconds from navigation start to the end of the load event, by the browser's clock.
    pub async fn load_ms(&self) -> Result<f64> {
        let script = "const t = performance.getEntriesByType('navigation')[0]; \
                      return t.loadEventEnd - t.startTime;";
        let v = self
            .call(
                reqwest::Method::POST,
                "/execute/sync",
                Some(json!({ "script": script, "args": [] })),
            )
            .await?;
        v.as_f64().context("no navigation timing")
    }

    /// A PNG of the viewport.
    pub async fn screenshot_png(&self) -> Result<Vec<u8>> {
        let v = self.call(reqwest::Method::GET, "/screenshot", None).await?;
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .context("the screenshot is not base64")
    }
}
