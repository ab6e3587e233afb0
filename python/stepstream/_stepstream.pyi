from typing import Any, Mapping, Optional

__version__: str
PROTOCOL_VERSION: int

class Run:
    def __init__(
        self,
        hub: str,
        project: str,
        name: str,
        *,
        config_json: str = "{}",
        run_id: Optional[str] = None,
        token: Optional[str] = None,
        rank: int = 0,
        world_size: int = 1,
        archive_dir: Optional[str] = None,
        archive_tag: str = "",
        flush_every: int = 10,
        defer_every: int = 10,
        system_interval: Optional[float] = None,
        memory_records: int = 500_000,
        spool_dir: Optional[str] = None,
        job: Optional[str] = None,
        framework: str = "",
        ca_file: Optional[str] = None,
        linger_ms: float = 40.0,
        console: bool = False,
    ) -> None: ...
    def log(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None: ...
    def flush(self) -> None: ...
    def console_write(self, text: str, stream: str = "stdout") -> None: ...
    def finish(self, status: str = "finished", message: Optional[str] = None, timeout: float = 30.0) -> dict: ...
    @property
    def next_step(self) -> int: ...
    @property
    def run_id(self) -> str: ...
    @property
    def metrics_csv(self) -> Optional[str]: ...
    @property
    def config_path(self) -> Optional[str]: ...
    @property
    def connected(self) -> bool: ...
    @property
    def last_error(self) -> Optional[str]: ...
    @property
    def has_commands(self) -> bool: ...
    def take_commands(self) -> list[dict]: ...
    def command_done(self, id: int, honoured: bool = True, message: str = "") -> None: ...
    def alert(self, title: str, text: str = "", level: str = "warning") -> bool: ...
