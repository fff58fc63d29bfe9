"""Client code of article 002 ("Qwen3-0.6B部署优化技巧，速度提升有妙招"), as the article prints it.

The article builds ``client`` at import time against ``http://localhost:8000/v1``; here
``connect(base_url)`` builds it (the same two lines, the base URL changed). Other changes are
marked ``# changed:`` or ``# added:``; a value a snippet prints is also returned. Its
``vllm serve`` command lines are run by test_article_002_serve.py.

Left out, and why:
- the latency and throughput claims (42 %, 2.3x, 80 ms, "普通模式，120ms"): timing on an RTX 4090;
- §3.2's ``from vllm.model_executor.input_metadata import InputMetadata``: an obsolete vLLM module,
  unused by the snippet; ``from vllm import LLM, SamplingParams`` becomes ``from swiftlm import ...``.
"""

from __future__ import annotations

import time

import openai

client: openai.OpenAI


def connect(base_url: str) -> None:
    """The article's module-level client (§3.1)."""
    global client  # added: built on demand instead of at import time
    # 直接使用openai官方客户端（v1.0+）
    client = openai.OpenAI(
        base_url=base_url,  # changed: base URL (the article's "http://localhost:8000/v1", vLLM服务地址)
        api_key="EMPTY",  # vLLM无需密钥
    )


# -- §3.1 直接调用OpenAI兼容接口 ---------------------------------------------------------------
def fast_invoke(prompt: str, thinking: bool = True) -> str:
    start = time.time()
    response = client.chat.completions.create(
        model="Qwen/Qwen3-0.6B",
        messages=[{"role": "user", "content": prompt}],
        temperature=0.5,
        max_tokens=512,
        extra_body={"enable_thinking": thinking},
    )
    end = time.time()
    print(f"端到端耗时: {end-start:.3f}s")
    return response.choices[0].message.content


# -- §3.2 Jupyter内嵌调用 ----------------------------------------------------------------------
def offline_generate():
    from swiftlm import LLM, SamplingParams  # changed: from vllm import LLM, SamplingParams

    # changed: `from vllm.model_executor.input_metadata import InputMetadata` removed (obsolete, unused)

    # 1. 加载模型（仅需一次）
    llm = LLM(
        model="Qwen/Qwen3-0.6B",
        enable_reasoning=True,
        reasoning_parser="deepseek_r1",
        gpu_memory_utilization=0.82,
        max_model_len=8192,
        block_size=32,
    )
    # 2. 定义采样参数
    sampling_params = SamplingParams(
        temperature=0.5,
        top_p=0.95,
        max_tokens=512,
        # 思维模式关键：通过prompt控制
        prompt_logprobs=None,
    )
    # 3. 直接推理（无网络，毫秒级）
    prompts = [
        "<think>如何计算圆的面积？</think>圆的面积公式是πr²，其中r是半径。",
        "用Python写一个快速排序函数",
    ]
    outputs = llm.generate(prompts, sampling_params)
    for output in outputs:
        print(f"Prompt: {output.prompt[:30]}...")
        print(f"Generated: {output.outputs[0].text[:100]}...\n")
    return prompts, outputs  # added: returned for the test


# -- §4.1 批量请求：用`openai.Batch`替代循环调用 -------------------------------------------------
def submit_batch(base_url: str):  # added: a function taking the server's address
    # 构建批量请求体（符合OpenAI Batch API格式）
    batch_requests = [
        {
            "custom_id": f"req_{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "Qwen/Qwen3-0.6B",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 256,
                "temperature": 0.4
            }
        }
        for i, prompt in enumerate([
            "总结机器学习三要素",
            "写一封辞职信模板",
            "解释HTTPS握手过程"
        ])
    ]
    # 发送批量请求（需vLLM启用batch endpoint）
    import requests
    response = requests.post(
        f"{base_url}/v1/batches",  # changed: base URL (the article's "http://localhost:8000/v1/batches")
        headers={"Content-Type": "application/json"},
        json={"input": batch_requests}
    )
    return response  # added: returned for the test


# -- §4.2 流式输出：手动解析<think>标签 ---------------------------------------------------------
def streaming_thinking(messages):
    stream = client.chat.completions.create(
        model="Qwen/Qwen3-0.6B",
        messages=messages,
        temperature=0.3,
        stream=True,
        extra_body={"enable_thinking": True},
    )
    thinking_buffer = ""
    final_buffer = ""
    in_thinking = False
    for chunk in stream:
        delta = chunk.choices[0].delta.content or ""
        # 实时解析think标签
        if "<think>" in delta:
            in_thinking = True
            delta = delta.replace("<think>", "")
        if "</think>" in delta:
            in_thinking = False
            delta = delta.replace("</think>", "")
        if in_thinking:
            thinking_buffer += delta
            # 实时显示思考过程（加灰显色）
            print(f"\033[90m💭 {delta}\033[0m", end="", flush=True)
        else:
            final_buffer += delta
            print(delta, end="", flush=True)
    return {"thinking": thinking_buffer.strip(), "response": final_buffer.strip()}


# -- §5.2 自动降级：思维模式动态切换 -----------------------------------------------------------
def smart_invoke(user_input: str) -> str:
    # 简单规则：短于10字 or 含问候词 → 禁用思维
    if len(user_input.strip()) < 10 or any(word in user_input.lower() for word in ["你好", "hi", "hello", "再见"]):
        thinking = False
        temp = 0.7
    else:
        thinking = True
        temp = 0.4
    response = client.chat.completions.create(
        model="Qwen/Qwen3-0.6B",
        messages=[{"role": "user", "content": user_input}],
        temperature=temp,
        extra_body={"enable_thinking": thinking},
    )
    return response.choices[0].message.content
