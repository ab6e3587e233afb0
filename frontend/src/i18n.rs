//! The page's words in English and Chinese. The language follows the browser
//! (`navigator.language`), `?lang=zh|en` overrides it, and the header button switches.

use stepstream_protocol::RunStatus;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    En,
    Zh,
}

impl Lang {
    pub fn detect() -> Lang {
        if let Some(l) = crate::query_param("lang") {
            return if l.starts_with("zh") {
                Lang::Zh
            } else {
                Lang::En
            };
        }
        let nav = web_sys::window()
            .and_then(|w| w.navigator().language())
            .unwrap_or_default();
        if nav.to_ascii_lowercase().starts_with("zh") {
            Lang::Zh
        } else {
            Lang::En
        }
    }

    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh",
        }
    }

    pub fn other(self) -> Lang {
        match self {
            Lang::En => Lang::Zh,
            Lang::Zh => Lang::En,
        }
    }
}

/// A phrase of the interface.
#[derive(Clone, Copy)]
pub enum Text {
    Runs,
    Project,
    Name,
    Status,
    LastStep,
    LastLoss,
    Age,
    Live,
    Reconnecting,
    NoRuns,
    PickRun,
    SwitchLanguage,
}

pub fn t(lang: Lang, text: Text) -> &'static str {
    use Text::*;
    match (lang, text) {
        (Lang::En, Runs) => "Runs",
        (Lang::Zh, Runs) => "训练任务",
        (Lang::En, Project) => "Project",
        (Lang::Zh, Project) => "项目",
        (Lang::En, Name) => "Name",
        (Lang::Zh, Name) => "名称",
        (Lang::En, Status) => "Status",
        (Lang::Zh, Status) => "状态",
        (Lang::En, LastStep) => "Last step",
        (Lang::Zh, LastStep) => "最新步数",
        (Lang::En, LastLoss) => "Last loss",
        (Lang::Zh, LastLoss) => "最新 loss",
        (Lang::En, Age) => "Last point",
        (Lang::Zh, Age) => "最后数据",
        (Lang::En, Live) => "live",
        (Lang::Zh, Live) => "实时",
        (Lang::En, Reconnecting) => "reconnecting…",
        (Lang::Zh, Reconnecting) => "重新连接中…",
        (Lang::En, NoRuns) => "No runs yet. Start a training job that streams to this hub.",
        (Lang::Zh, NoRuns) => "暂无训练任务。启动一个向本服务推送指标的训练即可。",
        (Lang::En, PickRun) => "Click one or more runs to watch their curves.",
        (Lang::Zh, PickRun) => "点击一个或多个训练任务查看曲线。",
        (Lang::En, SwitchLanguage) => "中文",
        (Lang::Zh, SwitchLanguage) => "English",
    }
}

pub fn status(lang: Lang, s: RunStatus) -> &'static str {
    match (lang, s) {
        (Lang::En, _) => s.as_str(),
        (Lang::Zh, RunStatus::Running) => "运行中",
        (Lang::Zh, RunStatus::Stale) => "无数据",
        (Lang::Zh, RunStatus::Finished) => "已完成",
        (Lang::Zh, RunStatus::Failed) => "失败",
        (Lang::Zh, RunStatus::Killed) => "被终止",
    }
}

/// The stale banner's sentence.
pub fn stale(lang: Lang, run: &str, seconds: f64, since: &str) -> String {
    match lang {
        Lang::En => format!(
            "{run}: no new data for {seconds:.0} s (since {since}). Crashed, or a network problem?"
        ),
        Lang::Zh => {
            format!("{run}：已 {seconds:.0} 秒没有新数据（自 {since} 起）。训练崩溃或网络异常？")
        }
    }
}

/// An age in seconds, short.
pub fn age(lang: Lang, seconds: f64) -> String {
    let s = seconds.max(0.0);
    let (n, unit_en, unit_zh) = if s < 90.0 {
        (s, "s", "秒")
    } else if s < 5400.0 {
        (s / 60.0, "min", "分钟")
    } else if s < 86_400.0 * 2.0 {
        (s / 3600.0, "h", "小时")
    } else {
        (s / 86_400.0, "d", "天")
    };
    match lang {
        Lang::En => format!("{n:.0} {unit_en} ago"),
        Lang::Zh => format!("{n:.0} {unit_zh}前"),
    }
}
