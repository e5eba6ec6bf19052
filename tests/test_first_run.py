"""The CPU first run's pieces fit together (scripts/cpu_first_run.sh runs them; minutes, not a test)."""

from agent.chat import IM_END, IM_START
from agent.config import load_agent_config
from agent.demo_tokenizer import demo_tokenizer, workspace_corpus, workspace_tokenizer
from agent.prompts import system_prompt
from agent.tools import default_tools
from policy_jax.run_config import load_run_config


def test_the_workspace_tokenizer_round_trips_and_shortens_an_episode_about_fourfold():
    tokenizer = workspace_tokenizer()
    text = f"{IM_START}assistant\nLet me read it: é 中 \t{{\"a\": 1}}\n{IM_END}"
    assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text
    assert tokenizer.encode(IM_END).ids == [tokenizer.token_to_id(IM_END)]
    episode_text = "".join(workspace_corpus()[:2])  # the system prompt and SKILL.md
    ours, demo = len(tokenizer.encode(episode_text).ids), len(demo_tokenizer().encode(episode_text).ids)
    assert ours * 3 < demo, (ours, demo)
    assert workspace_tokenizer.__wrapped__().to_str() == tokenizer.to_str()  # learnt the same way each time


def test_the_first_run_configs_agree_with_the_tokenizer_and_each_other():
    run = load_run_config("configs/tiny_first_run.yaml")
    agent = load_agent_config("configs/agent_first_run.yaml")
    assert run.model.vocab_size == workspace_tokenizer().get_vocab_size()
    # No episode is longer than the training window (so none is masked out as over-long).
    assert agent.context_budget_tokens <= run.train.seq_len <= run.model.max_position_embeddings
    assert len(workspace_tokenizer().encode(system_prompt(default_tools())).ids) < agent.context_budget_tokens // 3
    assert run.sampling.temperature == 0.0 and agent.backend == "host"
