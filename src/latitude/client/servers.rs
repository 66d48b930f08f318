//! The server calls of the Latitude.sh client: list (paged, reported),
//! find, get, create and delete, the last two fenced and retried only where
//! repeating them cannot make a second server.

use super::*;

impl LatitudeClient {
    /// Deletes a server, asking `fence` right before each attempt leaves.
    /// `Ok(false)` when the provider accepted the delete; `Ok(true)` when
    /// it answered 404, on the first attempt or after one whose answer was
    /// not seen: one absence, which the caller confirms before it believes
    /// the server gone (a 404 from a CDN or a lagging replica is no proof).
    /// Deleting is safe to repeat, so an unseen answer is retried; a budget
    /// spent on them ends as `Ambiguous`.
    pub async fn delete_server_fenced<F, Fut>(
        &self,
        id: &str,
        fence: F,
    ) -> Result<bool, LatitudeError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let call = "destroy-server";
        let mut backoff = self.inner.retry.backoff();
        let mut unseen = false;
        loop {
            let path = format!("/servers/{}", checked_id(call, id)?);
            let err = match self
                .attempt_fenced(call, Method::DELETE, &path, &[], None, &fence)
                .await
            {
                Ok(_) => return Ok(false),
                Err(LatitudeError::NotFound { .. }) => return Ok(true),
                Err(
                    e @ (LatitudeError::RateLimited { .. } | LatitudeError::ConnectFailed { .. }),
                ) => e,
                Err(e @ LatitudeError::Transient { .. }) => {
                    unseen = true;
                    e
                }
                Err(e) => return Err(e),
            };
            let Some(wait) = next_wait(&mut backoff, &err) else {
                return Err(if unseen {
                    LatitudeError::Ambiguous {
                        call,
                        reason: err.to_string(),
                    }
                } else {
                    err
                });
            };
            tracing::info!(call, wait_ms = wait.as_millis() as u64, error = %err, "delete not done; sending it again after a wait");
            tokio::time::sleep(wait).await;
        }
    }

    /// Deletes a server; a 404 after an attempt that looked failed means
    /// that attempt did the work.
    pub async fn delete_server(&self, id: &str) -> Result<(), LatitudeError> {
        let call = "destroy-server";
        let mut tried = false;
        self.retried(call, || {
            let first = !tried;
            tried = true;
            async move {
                match self
                    .attempt(
                        call,
                        Method::DELETE,
                        &format!("/servers/{}", checked_id(call, id)?),
                        &[],
                        None,
                    )
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(LatitudeError::NotFound { .. }) if !first => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .await
    }

    // ----- servers -----

    /// The project's servers that `which` selects, read whole. The first
    /// page asks for the total (`stats[total]=count`) and the pages are
    /// sorted by creation, so servers made meanwhile come last; a listing
    /// that read fewer servers than the total (one deleted mid-way shifts
    /// the pages under the reader) is read again, and a page the API
    /// capped below the size asked for does not end it early. The filter's
    /// match is checked here as well: an API that ignored it costs pages,
    /// never a wrong answer.
    pub async fn list_servers(&self, which: Servers<'_>) -> Result<Vec<Server>, LatitudeError> {
        Ok(self.list_servers_reported(which).await?.0)
    }

    /// [`LatitudeClient::list_servers`], with what the reading cost.
    pub async fn list_servers_reported(
        &self,
        which: Servers<'_>,
    ) -> Result<(Vec<Server>, ListingReport), LatitudeError> {
        let mut short = (0, 0);
        let mut pages = 0;
        for _ in 0..LISTING_READS {
            let once = self.list_servers_once(which).await?;
            pages += once.pages;
            match once.total {
                Some(total) if once.read < total => short = (once.read, total),
                _ => {
                    let report = ListingReport {
                        pages,
                        read: once.read,
                        kept: once.servers.len() as u64,
                        filter_ignored: once.filter_ignored,
                    };
                    return Ok((once.servers, report));
                }
            }
        }
        Err(LatitudeError::Undecodable {
            call: "get-servers",
            status: 200,
            detail: format!(
                "the listing changed while it was read, {LISTING_READS} times (last: {} servers read, {} counted)",
                short.0, short.1
            ),
        })
    }

    /// One reading of the listing.
    async fn list_servers_once(&self, which: Servers<'_>) -> Result<Once, LatitudeError> {
        let call = "get-servers";
        let mut seen = HashSet::new();
        let mut out = vec![];
        let mut total = None;
        let mut filter_ignored = false;
        let mut size = self.inner.page_size as usize;
        for number in 1..=MAX_PAGES {
            let mut query = vec![
                ("filter[project]", self.inner.project.clone()),
                ("page[size]", self.inner.page_size.to_string()),
                ("page[number]", number.to_string()),
                ("sort", "created_at".to_string()),
            ];
            if number == 1 {
                query.push(("stats[total]", "count".to_string()));
            }
            match which {
                Servers::All => {}
                Servers::Hostname(h) => query.push(("filter[hostname]", h.to_string())),
                Servers::HostnamePrefix(p) => {
                    query.push(("filter[hostname][prefix]", p.to_string()))
                }
            }
            let page: Page<Server> = self.read(call, "/servers", &query).await?;
            if number == 1 {
                total = page.total();
                // A first page shorter than asked while the total says more
                // follow: the API caps its pages, and its cap is the size.
                if total.is_some_and(|t| t as usize > page.data.len()) && !page.data.is_empty() {
                    size = size.min(page.data.len());
                }
            }
            let short = page.data.len() < size;
            for s in page.data {
                if !seen.insert(s.id.clone()) {
                    continue;
                }
                if which.selects(s.hostname()) {
                    out.push(s);
                } else {
                    filter_ignored = true;
                }
            }
            let done = total.is_some_and(|t| seen.len() as u64 >= t);
            if short || done {
                return Ok(Once {
                    servers: out,
                    read: seen.len() as u64,
                    total,
                    pages: number,
                    filter_ignored,
                });
            }
        }
        Err(LatitudeError::Undecodable {
            call,
            status: 200,
            detail: format!("more than {MAX_PAGES} pages"),
        })
    }

    /// The server carrying this hostname, if one exists.
    pub async fn find_by_hostname(&self, hostname: &str) -> Result<Option<Server>, LatitudeError> {
        let mut found = self.list_servers(Servers::Hostname(hostname)).await?;
        Ok(if found.is_empty() {
            None
        } else {
            Some(found.remove(0))
        })
    }

    pub async fn get_server(&self, id: &str) -> Result<Server, LatitudeError> {
        let e: Envelope<Server> = self
            .read(
                "get-server",
                &format!("/servers/{}", checked_id("get-server", id)?),
                &[],
            )
            .await?;
        Ok(e.data)
    }

    /// Creates a server, never twice for one hostname. An attempt whose
    /// answer was not seen (a timeout, a broken connection, a 5xx from the
    /// API or a gateway in front of it, an unreadable 201) ends the call as
    /// `Ambiguous` at once: the server may exist, and the listings that
    /// would show it can lag, so only the caller can settle it, by looking
    /// after a settle window. A 429 and a connection that never opened
    /// sent nothing, so those are sent again after the wait. Out of stock
    /// and refusals end it.
    pub async fn create_server(&self, req: &CreateServer) -> Result<Created, LatitudeError> {
        self.create_server_fenced(req, || async { Ok(()) }).await
    }

    /// [`LatitudeClient::create_server`], asking `fence` before every POST
    /// whether this caller may still send one (it still holds the lock
    /// that makes it the only sender for the hostname). A refusal sends
    /// nothing and ends the call as `NotSent`.
    pub async fn create_server_fenced<F, Fut>(
        &self,
        req: &CreateServer,
        fence: F,
    ) -> Result<Created, LatitudeError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let call = "create-server";
        let body = json!({"data": {"type": "servers", "attributes": {
            "project": self.inner.project,
            "plan": req.plan,
            "site": req.site,
            "operating_system": req.operating_system,
            "hostname": req.hostname,
            "ssh_keys": req.ssh_keys,
        }}});
        let mut backoff = self.inner.retry.backoff();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let unseen = |reason: String| LatitudeError::Ambiguous { call, reason };
            let err = match self
                .attempt_fenced(call, Method::POST, "/servers", &[], Some(&body), &fence)
                .await
            {
                Err(LatitudeError::NotSent { reason, .. }) => {
                    return Err(LatitudeError::NotSent {
                        call,
                        reason: format!("no longer the only sender for this hostname: {reason}"),
                    });
                }
                Ok(a) if a.status == 201 => {
                    return match decode::<Envelope<Server>>(call, &a) {
                        Ok(e) => Ok(Created {
                            server: e.data,
                            recovered: false,
                            attempts,
                        }),
                        Err(e) => Err(unseen(format!("the create was accepted: {e}"))),
                    };
                }
                Ok(a) => return Err(unseen(format!("unexpected status {}", a.status))),
                Err(
                    e @ (LatitudeError::RateLimited { .. } | LatitudeError::ConnectFailed { .. }),
                ) => e,
                Err(LatitudeError::Transient { reason, .. }) => return Err(unseen(reason)),
                Err(LatitudeError::Undecodable { status, detail, .. }) if status >= 500 => {
                    return Err(unseen(format!("{status}: {detail}")));
                }
                Err(e) => return Err(e),
            };
            let Some(wait) = next_wait(&mut backoff, &err) else {
                return Err(err);
            };
            tracing::info!(call, attempt = attempts, wait_ms = wait.as_millis() as u64, error = %err, "create not sent; sending it after a wait");
            tokio::time::sleep(wait).await;
        }
    }
}
