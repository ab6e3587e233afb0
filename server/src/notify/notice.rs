//! One alert event as every channel renders it: its title, plain text and markdown, with
//! every name people chose made inert for the channel's formatting.

/// One alert event, as every channel renders it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Notice {
    pub run_id: String,
    pub project: String,
    pub run_name: String,
    pub rule: String,
    /// `fired` or `resolved`.
    pub state: &'static str,
    pub step: i64,
    pub value: f64,
    pub message: String,
    pub at: f64,
    pub link: Option<String>,
}

/// Text people named (project, run, rule) or the hub wrote about them, made inert for a
/// channel that formats: a run named `**x**` or `[click](http://evil)` must show as itself,
/// and one holding `<@all>` or `<at user_id="all">` must not page a whole group.
#[derive(Clone, Copy)]
pub(super) enum Escape {
    /// DingTalk's and WeCom's markdown: emphasis, code, link brackets and tables
    /// backslash-escaped (headings and lists at the start), `<`, `>` and `&` as entities
    /// (WeCom reads `<font>` and `<@user>` in it).
    Markdown,
    /// Slack's mrkdwn: `&`, `<` and `>` as entities, its documented escapes (formatting is
    /// also turned off for the message).
    Slack,
    /// Feishu's plain text: only its `<at ...>` tags are special; angle brackets become
    /// full-width ones.
    FeishuText,
}

fn escape(s: &str, how: Escape) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for (i, c) in s.chars().enumerate() {
        match (how, c) {
            // A heading or a list only where a line starts.
            (Escape::Markdown, '#' | '-' | '+') if i == 0 => {
                out.push('\\');
                out.push(c);
            }
            (Escape::Markdown, '<') | (Escape::Slack, '<') => out.push_str("&lt;"),
            (Escape::Markdown, '>') | (Escape::Slack, '>') => out.push_str("&gt;"),
            (Escape::Markdown, '&') | (Escape::Slack, '&') => out.push_str("&amp;"),
            (Escape::Markdown, c) if "\\`*_[]|~".contains(c) => {
                out.push('\\');
                out.push(c);
            }
            (Escape::FeishuText, '<') => out.push('\u{ff1c}'),
            (Escape::FeishuText, '>') => out.push('\u{ff1e}'),
            (_, c) => out.push(c),
        }
    }
    out
}

impl Notice {
    /// The notice with every field people control escaped for `how`.
    pub(super) fn escaped(&self, how: Escape) -> Notice {
        Notice {
            project: escape(&self.project, how),
            run_name: escape(&self.run_name, how),
            rule: escape(&self.rule, how),
            message: escape(&self.message, how),
            ..self.clone()
        }
    }

    pub(super) fn title(&self) -> String {
        let what = if self.state == "fired" {
            "ALERT"
        } else {
            "resolved"
        };
        format!(
            "[stepstream {what}] {}/{}: {}",
            self.project, self.run_name, self.rule
        )
    }

    pub(super) fn text(&self) -> String {
        let mut t = format!(
            "{}\nrun {} ({}), step {}, value {}\n{}",
            self.title(),
            self.run_name,
            self.run_id,
            self.step,
            self.value,
            self.message
        );
        if let Some(link) = &self.link {
            t.push_str(&format!("\n{link}"));
        }
        t
    }

    pub(super) fn markdown(&self) -> String {
        let mut t = format!(
            "### {}\n- run: **{}** (`{}`)\n- rule: **{}**\n- step: {}\n- value: {}\n\n{}",
            self.title(),
            self.run_name,
            self.run_id,
            self.rule,
            self.step,
            self.value,
            self.message
        );
        if let Some(link) = &self.link {
            t.push_str(&format!("\n\n[open the run]({link})"));
        }
        t
    }
}
