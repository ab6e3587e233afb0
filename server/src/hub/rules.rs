//! Rules made in the page (`alerts::custom`): the hub holds each project's rules in memory,
//! read from the store at start and again whenever one is added or deleted (here, or on
//! another hub of the cluster, which says so), and judges them on every record of the
//! project's runs, beside the built-in rules. A project without such rules costs nothing.

use super::{Hub, Run};
use crate::alerts::custom::{self, PageRule, Said};
use crate::store::StoreError;
use std::collections::HashMap;
use std::sync::Arc;
use stepstream_protocol::{unix_now, StepRecord, ToPeer};

/// One project's rules, with their ids.
pub type ProjectRules = Arc<Vec<(u64, PageRule)>>;

/// A page rule's state on one run: per (rule id, metric id).
#[derive(Default)]
pub struct CustomStates(HashMap<(u64, u32), custom::State>);

impl Hub {
    /// Reads every project's rules from the store again.
    pub async fn load_rules(&self) -> Result<(), StoreError> {
        let stored = self.store.rules().await?;
        let mut by_project: HashMap<String, Vec<(u64, PageRule)>> = HashMap::new();
        for r in stored {
            match serde_json::from_str::<PageRule>(&r.body) {
                Ok(rule) => by_project.entry(r.project).or_default().push((r.id, rule)),
                Err(e) => {
                    tracing::warn!(id = r.id, error = %e, "a stored page rule does not read; skipped")
                }
            }
        }
        let n: usize = by_project.values().map(Vec::len).sum();
        *self.page_rules.write().unwrap_or_else(|e| e.into_inner()) = by_project
            .into_iter()
            .map(|(p, rules)| (p, Arc::new(rules)))
            .collect();
        tracing::debug!(rules = n, "page rules loaded");
        Ok(())
    }

    /// The rules made in the page for `project`.
    pub fn rules_of(&self, project: &str) -> ProjectRules {
        self.page_rules
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(project)
            .cloned()
            .unwrap_or_default()
    }

    /// The page rule of `project` that picks built-in `rule`'s channels and action.
    pub fn builtin_rule_of(&self, project: &str, rule: &str) -> Option<PageRule> {
        self.rules_of(project)
            .iter()
            .find(|(_, r)| r.builtin() == Some(rule))
            .map(|(_, r)| r.clone())
    }

    /// Adds a project's rule: stored, in force at once here and, told, on the other hubs.
    pub async fn add_rule(
        &self,
        project: &str,
        rule: PageRule,
        by: String,
    ) -> Result<u64, StoreError> {
        let body = serde_json::to_string(&rule).unwrap_or_default();
        let id = self
            .store
            .add_rule(project.to_string(), body, by, unix_now())
            .await?;
        self.rules_changed(project).await?;
        Ok(id)
    }

    /// Deletes a project's rule; whether it existed.
    pub async fn delete_rule(&self, project: &str, id: u64) -> Result<bool, StoreError> {
        let gone = self.store.delete_rule(project.to_string(), id).await?;
        self.rules_changed(project).await?;
        Ok(gone)
    }

    async fn rules_changed(&self, project: &str) -> Result<(), StoreError> {
        self.load_rules().await?;
        let project = project.to_string();
        self.tell_peers(|hub| ToPeer::PeerRules(stepstream_protocol::PeerRules { hub, project }));
        Ok(())
    }

    /// Queues a notice on the channels these names or kinds pick (all when empty); the
    /// labels of those it went to.
    pub fn notify_to(&self, notice: crate::notify::Notice, kinds: &[String]) -> Vec<String> {
        self.notifier.send_to(notice, kinds)
    }

    /// The channels' labels (names, else kinds): all the page may know of them.
    pub fn channel_labels(&self) -> Vec<String> {
        self.notifier.labels()
    }

    /// Whether `wanted` names a configured channel or the kind of one.
    pub fn has_channel(&self, wanted: &str) -> bool {
        self.notifier.picks(wanted)
    }

    /// Judges the project's page rules on a batch's records; the alerts to raise, as
    /// `(rule name, fired, step, value, message, channels, action)`.
    pub(super) fn judge_page_rules(
        &self,
        run: &Arc<Run>,
        records: &[StepRecord],
    ) -> Vec<PageAlert> {
        let project = run.state(|st| st.identity.project.clone());
        let rules = self.rules_of(&project);
        if rules.is_empty() {
            return Vec::new();
        }
        let now = unix_now();
        run.state_mut(|st| {
            let mut out = Vec::new();
            // Which metrics each rule reads, by id, once per batch.
            let reads: Vec<Vec<(u32, String)>> = rules
                .iter()
                .map(|(_, r)| {
                    st.metrics
                        .iter()
                        .filter(|m| r.reads(&m.name))
                        .map(|m| (m.id.0, m.name.clone()))
                        .collect()
                })
                .collect();
            for rec in records {
                for ((id, rule), metrics) in rules.iter().zip(&reads) {
                    for (mid, name) in metrics {
                        let Some(&(_, v)) = rec.values.iter().find(|(m, _)| m.0 == *mid) else {
                            continue;
                        };
                        let state = st.custom.0.entry((*id, *mid)).or_default();
                        let said = if matches!(rule.when, custom::When::Stale { .. }) {
                            state.arrived(rec.step, now)
                        } else {
                            custom::judge(rule, name, state, rec.step, v)
                        };
                        if let Some(said) = said {
                            let (fired, value, message) = match said {
                                Said::Fired { value, message } => (true, value, message),
                                Said::Resolved => (
                                    false,
                                    f64::NAN,
                                    format!(
                                        "{} cleared at step {}",
                                        rule.alert_name(name),
                                        rec.step
                                    ),
                                ),
                            };
                            out.push(PageAlert {
                                rule: rule.alert_name(name),
                                fired,
                                step: rec.step,
                                value,
                                message,
                                channels: rule.channels.clone(),
                                action: rule.action.clone(),
                            });
                        }
                    }
                }
            }
            out
        })
    }
}

impl Hub {
    /// The stale page rules on the hub's clock (the status clock's tick): a metric a rule
    /// reads that had no new point for its seconds fires once.
    pub(super) fn stale_page_rules(&self, run: &Arc<Run>, now: f64) -> Vec<PageAlert> {
        let project = run.state(|st| st.identity.project.clone());
        let rules = self.rules_of(&project);
        if !rules
            .iter()
            .any(|(_, r)| matches!(r.when, custom::When::Stale { .. }))
        {
            return Vec::new();
        }
        run.state_mut(|st| {
            let mut out = Vec::new();
            for (id, rule) in rules.iter() {
                for m in &st.metrics {
                    if !rule.reads(&m.name) {
                        continue;
                    }
                    let Some(state) = st.custom.0.get_mut(&(*id, m.id.0)) else {
                        continue;
                    };
                    if let Some((step, Said::Fired { value, message })) =
                        state.silent(rule, &m.name, now)
                    {
                        out.push(PageAlert {
                            rule: rule.alert_name(&m.name),
                            fired: true,
                            step,
                            value,
                            message,
                            channels: rule.channels.clone(),
                            action: rule.action.clone(),
                        });
                    }
                }
            }
            out
        })
    }
}

impl Hub {
    /// The steps where built-in `rule` would have fired on the run's stored history: its
    /// records replayed through a fresh judge, their wall times standing in for the hub's
    /// clock (`stale`: a gap of `--stale-after` between records). `straggler` compares the
    /// ranks of a job live and has no preview (none).
    pub async fn preview_builtin(
        &self,
        run: &Arc<Run>,
        rule: &str,
    ) -> Result<Vec<i64>, StoreError> {
        let (metrics, config, through) = run.state(|st| {
            (
                st.metrics.clone(),
                st.identity.config_json.clone(),
                st.tail.last_seq,
            )
        });
        let rules = self.rules.clone();
        let rule = rule.to_string();
        let stale_after = self.policy.stale_after.as_secs_f64();
        let judge = crate::alerts::RunRules::new(&config);
        let (_, _, fired) = self
            .store
            .scan(
                run.key,
                0,
                through,
                (judge, None::<(i64, f64)>, Vec::new()),
                move |(judge, last, fired), _, records| {
                    let mut sample = crate::alerts::Sample::default();
                    for r in records {
                        if rule == "stale" {
                            if last.is_some_and(|(_, at)| r.wall_time - at >= stale_after) {
                                fired.push(last.map_or(r.step, |(s, _)| s));
                            }
                            *last = Some((r.step, r.wall_time));
                            continue;
                        }
                        judge.sample(&rules, &metrics, r, &mut sample);
                        let judged = judge.judge(&rules, r.step, &sample);
                        for e in judge.events(&rules, r.step, judged, r.wall_time) {
                            if let crate::alerts::Event::Fired {
                                rule: name, step, ..
                            } = e
                            {
                                if name == rule {
                                    fired.push(step);
                                }
                            }
                        }
                    }
                    std::ops::ControlFlow::Continue(())
                },
            )
            .await?;
        Ok(fired)
    }
}

/// An alert a page rule raised.
pub struct PageAlert {
    pub rule: String,
    pub fired: bool,
    pub step: i64,
    pub value: f64,
    pub message: String,
    pub channels: Vec<String>,
    pub action: Option<crate::alerts::actions::RuleAction>,
}
