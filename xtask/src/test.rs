pub fn run(_root: &std::path::Path, _args: &[String]) -> anyhow::Result<()> { todo!() }
