"""Client code of article 001 ("Qwen3-0.6B推理延迟高？GPU加速优化部署案例分享"), as the article prints it.

Each snippet is copied into a function so a test can point it at its server; changes are marked
``# changed:`` or ``# added:``; a value a snippet prints is also returned.

Left out, and why:
- §4's CPU / T4 / vLLM latency table and "后续请求稳定在600ms以内": timing claims on other hardware;
- §5.1 ``SQLiteCache`` from ``langchain_community``: a LangChain-side response cache that never
  reaches the server, and ``langchain_community`` is not a dependency of the test suite;
- §5.3 ``nvidia-smi`` and Prometheus + Grafana: a real GPU and other servers.
"""

from __future__ import annotations

from langchain_openai import ChatOpenAI


# -- §2.2 使用LangChain调用Qwen3-0.6B ---------------------------------------------------------
def langchain_streaming(base_url: str):
    chat_model = ChatOpenAI(
        model="Qwen-0.6B",
        temperature=0.5,
        base_url=base_url,  # changed: base URL (the article's: 当前Jupyter对应的推理服务地址)
        api_key="EMPTY",  # 因为是本地服务，不需要真实API Key
        extra_body={
            "enable_thinking": True,
            "return_reasoning": True,
        },
        streaming=True,  # 开启流式输出，提升感知速度
    )
    # 发起调用
    response = chat_model.invoke("你是谁？")
    print(response.content)
    return response  # added: returned for the test


# -- §5.2 控制temperature和max_tokens防止过度生成 ---------------------------------------------
def bounded_generation():
    """The snippet names no base URL or key: LangChain reads OPENAI_API_BASE and OPENAI_API_KEY."""
    chat_model = ChatOpenAI(
        model="Qwen-0.6B",
        temperature=0.5,  # 避免过高导致胡说
        max_tokens=128,  # 限制最大输出长度
        top_p=0.9,
    )
    return chat_model  # added: returned for the test
