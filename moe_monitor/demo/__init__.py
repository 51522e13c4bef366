"""The live demo: a private Redis, a real DeepSeek-V3-shaped transformers MoE on the CPU, the dashboard."""
