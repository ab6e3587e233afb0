//! Per-project retention (`serve --retain PROJECT=RULE`): which ended runs the hub deletes
//! on its own. A rule keeps runs for an age (`30d`, `12h`, `90m`, `45s`, counted from the
//! run's end), the last N runs that ended (`100`), or both (`30d,100`: a run goes when
//! either says so). `*` names every project without a rule of its own. Runs that have not
//! ended are never touched. Without `--retain` nothing is deleted.

use std::collections::BTreeMap;

/// What one project keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Keep {
    /// Ended runs older than this (seconds since their end) go.
    pub max_age_s: Option<f64>,
    /// Only this many of the most recently ended runs stay.
    pub last: Option<usize>,
}

/// Every project's rule.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Retention {
    projects: BTreeMap<String, Keep>,
    /// The rule of projects not named (`*`).
    others: Option<Keep>,
}

/// An ended run as retention sees it.
#[derive(Clone, Debug)]
pub struct Ended<K> {
    pub project: String,
    /// When it ended (unix seconds, the hub's clock).
    pub ended_at: f64,
    pub key: K,
}

impl Retention {
    /// Whether any rule is set (without one, the hub never looks).
    pub fn is_set(&self) -> bool {
        self.others.is_some() || !self.projects.is_empty()
    }

    /// Adds `PROJECT=RULE`, as `--retain` is given; the error says what is wrong.
    pub fn add(&mut self, spec: &str) -> Result<(), String> {
        let (project, rule) = spec
            .split_once('=')
            .ok_or_else(|| format!("--retain {spec:?}: expected PROJECT=RULE, e.g. '*=30d'"))?;
        let project = project.trim();
        if project.is_empty() {
            return Err(format!(
                "--retain {spec:?}: the project is empty (use * for all)"
            ));
        }
        let mut keep = Keep::default();
        for part in rule.split(',').map(str::trim) {
            if let Ok(n) = part.parse::<usize>() {
                if n == 0 {
                    return Err(format!("--retain {spec:?}: keeping the last 0 runs deletes each run as it ends; give at least 1"));
                }
                keep.last = Some(n);
                continue;
            }
            let unit = part.chars().last().unwrap_or(' ');
            let seconds = match unit {
                's' => 1.0,
                'm' => 60.0,
                'h' => 3600.0,
                'd' => 86_400.0,
                _ => {
                    return Err(format!(
                        "--retain {spec:?}: {part:?} is neither a count of runs (100) nor an age \
                         (30d, 12h, 90m, 45s)"
                    ))
                }
            };
            let amount: f64 = part[..part.len() - 1]
                .parse()
                .ok()
                .filter(|a: &f64| a.is_finite() && *a > 0.0)
                .ok_or_else(|| format!("--retain {spec:?}: {part:?} is not a positive age"))?;
            keep.max_age_s = Some(amount * seconds);
        }
        if project == "*" {
            self.others = Some(keep);
        } else {
            self.projects.insert(project.to_string(), keep);
        }
        Ok(())
    }

    /// The rule for `project`, if any.
    pub fn keep(&self, project: &str) -> Option<Keep> {
        self.projects.get(project).copied().or(self.others)
    }

    /// Of these ended runs, those the rules delete at `now`.
    pub fn doomed<K: Clone>(&self, ended: &[Ended<K>], now: f64) -> Vec<K> {
        let mut by_project: BTreeMap<&str, Vec<&Ended<K>>> = BTreeMap::new();
        for e in ended {
            by_project.entry(&e.project).or_default().push(e);
        }
        let mut out = Vec::new();
        for (project, mut runs) in by_project {
            let Some(keep) = self.keep(project) else {
                continue;
            };
            // Newest end first: the last N are the first N.
            runs.sort_by(|a, b| b.ended_at.total_cmp(&a.ended_at));
            for (i, run) in runs.into_iter().enumerate() {
                let too_many = keep.last.is_some_and(|n| i >= n);
                let too_old = keep.max_age_s.is_some_and(|age| now - run.ended_at > age);
                if too_many || too_old {
                    out.push(run.key.clone());
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(project: &str, ended_at: f64, key: u32) -> Ended<u32> {
        Ended {
            project: project.into(),
            ended_at,
            key,
        }
    }

    #[test]
    fn rules_parse_and_bad_ones_say_why() {
        let mut r = Retention::default();
        assert!(!r.is_set());
        r.add("*=30d").unwrap();
        r.add("sweeps=12h,5").unwrap();
        assert_eq!(
            r.keep("other"),
            Some(Keep {
                max_age_s: Some(30.0 * 86_400.0),
                last: None
            })
        );
        assert_eq!(
            r.keep("sweeps"),
            Some(Keep {
                max_age_s: Some(12.0 * 3600.0),
                last: Some(5)
            })
        );
        for bad in ["30d", "=3", "p=0", "p=3w", "p=-1d", "p=d", "p=nand"] {
            let e = r.clone().add(bad).unwrap_err();
            assert!(e.contains("--retain"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_last_n_and_the_age_each_delete_and_other_projects_are_left() {
        let mut r = Retention::default();
        r.add("a=2").unwrap();
        r.add("b=10s").unwrap();
        let runs = [
            ended("a", 100.0, 1),
            ended("a", 300.0, 2),
            ended("a", 200.0, 3),
            ended("b", 80.0, 4),
            ended("b", 95.0, 5),
            ended("c", 0.0, 6),
        ];
        let mut doomed = r.doomed(&runs, 100.0);
        doomed.sort();
        // a: the oldest end beyond the last two; b: ended more than 10 s ago; c: no rule.
        assert_eq!(doomed, vec![1, 4]);
        r.add("*=1").unwrap();
        let mut doomed = r.doomed(&runs, 100.0);
        doomed.sort();
        assert_eq!(doomed, vec![1, 4]);
        let runs = [ended("c", 0.0, 6), ended("c", 1.0, 7)];
        assert_eq!(r.doomed(&runs, 100.0), vec![6]);
    }
}
