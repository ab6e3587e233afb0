//! The page's words in English and Chinese. The language follows the browser
//! (`navigator.language`), `?lang=zh|en` overrides it (see `view.rs`), and the header button
//! switches.

use stepstream_protocol::RunStatus;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    En,
    Zh,
}

impl Lang {
    pub fn detect() -> Lang {
        // `?lang=` is the view's (`view.rs`); this is the browser's language.
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
    Search,
    AllStatuses,
    GroupByProject,
    Ranks,
    Smoothing,
    XAxis,
    AxisStep,
    AxisWall,
    AxisRelative,
    AxisCounts,
    AxisMetrics,
    GroupBy,
    GroupNone,
    GroupJob,
    GroupName,
    GroupConfig,
    CenterMean,
    CenterMedian,
    BandMinMax,
    BandStd,
    GroupMembers,
    AllSegments,
    Follow,
    Zoomed,
    FilterMetrics,
    GroupTraining,
    GroupSpeed,
    GroupSystem,
    GroupOther,
    GroupLayers,
    LogScale,
    IgnoreOutliers,
    Enlarge,
    Png,
    Csv,
    Config,
    Host,
    Rank,
    Framework,
    Started,
    Duration,
    AlertsWord,
    Compare,
    OnlyDiff,
    Key,
    Theme,
    Embed,
    EmbedHint,
    EmbedFrame,
    Console,
    ConsoleSearch,
    AllStreams,
    AllRuns,
    Download,
    LinesDropped,
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
        (Lang::En, Search) => "Search: name, project, key=value",
        (Lang::Zh, Search) => "搜索：名称、项目、key=value",
        (Lang::En, AllStatuses) => "all statuses",
        (Lang::Zh, AllStatuses) => "全部状态",
        (Lang::En, GroupByProject) => "group by project",
        (Lang::Zh, GroupByProject) => "按项目分组",
        (Lang::En, Ranks) => "ranks",
        (Lang::Zh, Ranks) => "个进程",
        (Lang::En, Smoothing) => "Smoothing",
        (Lang::Zh, Smoothing) => "平滑",
        (Lang::En, XAxis) => "x axis",
        (Lang::Zh, XAxis) => "横轴",
        (Lang::En, AxisStep) => "step",
        (Lang::Zh, AxisStep) => "步数",
        (Lang::En, AxisWall) => "wall time",
        (Lang::Zh, AxisWall) => "时间",
        (Lang::En, AxisRelative) => "relative time",
        (Lang::Zh, AxisRelative) => "相对时间",
        (Lang::En, AxisCounts) => "tokens, samples, epochs",
        (Lang::Zh, AxisCounts) => "token、样本、轮次",
        (Lang::En, GroupBy) => "group",
        (Lang::Zh, GroupBy) => "分组",
        (Lang::En, GroupNone) => "none",
        (Lang::Zh, GroupNone) => "不分组",
        (Lang::En, GroupJob) => "by job",
        (Lang::Zh, GroupJob) => "按作业",
        (Lang::En, GroupName) => "by name pattern",
        (Lang::Zh, GroupName) => "按名称模式",
        (Lang::En, GroupConfig) => "by config key",
        (Lang::Zh, GroupConfig) => "按配置项",
        (Lang::En, CenterMean) => "mean",
        (Lang::Zh, CenterMean) => "均值",
        (Lang::En, CenterMedian) => "median",
        (Lang::Zh, CenterMedian) => "中位数",
        (Lang::En, BandMinMax) => "min-max band",
        (Lang::Zh, BandMinMax) => "最小-最大带",
        (Lang::En, BandStd) => "± std band",
        (Lang::Zh, BandStd) => "± 标准差带",
        (Lang::En, AllSegments) => "all segments of resumed runs",
        (Lang::Zh, AllSegments) => "显示续训的全部分段",
        (Lang::En, GroupMembers) => "runs",
        (Lang::Zh, GroupMembers) => "各运行",
        (Lang::En, AxisMetrics) => "other metrics",
        (Lang::Zh, AxisMetrics) => "其他指标",
        (Lang::En, Follow) => "Follow live",
        (Lang::Zh, Follow) => "跟随最新",
        (Lang::En, Zoomed) => "zoomed",
        (Lang::Zh, Zoomed) => "已缩放",
        (Lang::En, FilterMetrics) => "Filter metrics",
        (Lang::Zh, FilterMetrics) => "筛选指标",
        (Lang::En, GroupTraining) => "Training",
        (Lang::Zh, GroupTraining) => "训练",
        (Lang::En, GroupSpeed) => "Speed",
        (Lang::Zh, GroupSpeed) => "速度",
        (Lang::En, GroupSystem) => "System",
        (Lang::Zh, GroupSystem) => "系统",
        (Lang::En, GroupLayers) => "Per layer (see the heatmaps)",
        (Lang::Zh, GroupLayers) => "逐层指标（见热力图）",
        (Lang::En, GroupOther) => "Other",
        (Lang::Zh, GroupOther) => "其他",
        (Lang::En, LogScale) => "log",
        (Lang::Zh, LogScale) => "对数",
        (Lang::En, IgnoreOutliers) => "ignore outliers",
        (Lang::Zh, IgnoreOutliers) => "忽略离群点",
        (Lang::En, Enlarge) => "enlarge",
        (Lang::Zh, Enlarge) => "放大",
        (Lang::En, Png) => "PNG",
        (Lang::Zh, Png) => "PNG",
        (Lang::En, Console) => "Console",
        (Lang::Zh, Console) => "控制台输出",
        (Lang::En, ConsoleSearch) => "search (regular expression)",
        (Lang::Zh, ConsoleSearch) => "搜索（正则表达式）",
        (Lang::En, AllStreams) => "stdout + stderr",
        (Lang::Zh, AllStreams) => "stdout + stderr",
        (Lang::En, AllRuns) => "all runs",
        (Lang::Zh, AllRuns) => "全部任务",
        (Lang::En, Download) => "download",
        (Lang::Zh, Download) => "下载",
        (Lang::En, LinesDropped) => "oldest lines dropped by the hub",
        (Lang::Zh, LinesDropped) => "行最早的输出已被服务器丢弃",
        (Lang::En, Csv) => "CSV",
        (Lang::Zh, Csv) => "CSV",
        (Lang::En, Embed) => "Embed this chart",
        (Lang::Zh, Embed) => "嵌入此图表",
        (Lang::En, EmbedHint) => "Paste into any page. From another origin, start the hub with --allow-origin naming it; with read tokens, add data-token with one scoped to this run (stepstream token --run ID).",
        (Lang::Zh, EmbedHint) => "粘贴到任意网页。跨源使用时，用 --allow-origin 允许该网页的源；启用读令牌时，加上只限此任务的 data-token（stepstream token --run ID）。",
        (Lang::En, EmbedFrame) => "as an iframe",
        (Lang::Zh, EmbedFrame) => "以 iframe 打开",
        (Lang::En, Config) => "Config",
        (Lang::Zh, Config) => "超参数",
        (Lang::En, Host) => "Host",
        (Lang::Zh, Host) => "主机",
        (Lang::En, Rank) => "Rank",
        (Lang::Zh, Rank) => "进程号",
        (Lang::En, Framework) => "Framework",
        (Lang::Zh, Framework) => "框架",
        (Lang::En, Started) => "Started",
        (Lang::Zh, Started) => "开始",
        (Lang::En, Duration) => "Duration",
        (Lang::Zh, Duration) => "时长",
        (Lang::En, AlertsWord) => "Alerts",
        (Lang::Zh, AlertsWord) => "告警",
        (Lang::En, Compare) => "Compare",
        (Lang::Zh, Compare) => "对比",
        (Lang::En, OnlyDiff) => "only differing keys",
        (Lang::Zh, OnlyDiff) => "仅显示不同的键",
        (Lang::En, Key) => "Key",
        (Lang::Zh, Key) => "键",
        (Lang::En, Theme) => "Theme",
        (Lang::Zh, Theme) => "主题",
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
        (Lang::Zh, RunStatus::Stopped) => "已停止",
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
