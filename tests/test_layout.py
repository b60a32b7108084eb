"""实验室的形状:README 的课文对照表指向的函数都在,练习的标题都在,课文文件先讲课文,旁边的模块各说一段自己补了什么。

只读源码(ast),不 import 也不起进程:几毫秒跑完。
"""
import ast
import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
LESSON_FILES = ("store.py", "webhook.py", "send_webhook.py", "agent.py", "worker.py", "inbox.py",
                "email_poller.py", "cron_jobs.py", "llm.py")
README = (HERE / "README.md").read_text(encoding="utf-8")


def top_level_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def readme_table(heading: str) -> list[list[str]]:
    """README 里 heading 那一节的表格,去掉表头和分隔行,每行是各格的文字。"""
    section = README.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    return rows[2:]


def test_every_function_in_the_lesson_map_exists_in_the_file_it_names():
    rows = readme_table("课文对照")
    assert len(rows) >= 15
    for lesson, where in rows:
        file, _, functions = where.partition("·")
        path = HERE / file.strip().strip("`")
        names = re.findall(r"`(\w+)\(\)`", functions)
        assert path.exists() and names, (lesson, where)
        missing = set(names) - set(top_level_names(path))
        assert not missing, f"{lesson}:{path.name} 里没有 {missing}"


def test_every_exercise_heading_the_readme_points_to_is_in_that_file():
    rows = readme_table("练习答案在哪")
    assert [row[0].split()[0] for row in rows] == ["2", "3", "4", "5", "6"]
    for exercise, where, _ in rows:
        number = exercise.split()[0]
        files = re.findall(r"`(\w+\.py)`", where)
        assert files, exercise
        for file in files:
            text = (HERE / file).read_text(encoding="utf-8")
            assert f"# ---- 练习 {number}:" in text, f"{file} 里没有练习 {number} 的标题"


@pytest.mark.parametrize("file, function, must_contain", [
    ("worker.py", "claim", "RETURNING"),                    # 原子领取:一条 UPDATE … RETURNING
    ("webhook.py", "verify_cloudledger", "compare_digest"),  # 验签
    ("agent.py", "review", "interrupt("),                    # HumanInterrupt 和 interrupt()
    ("inbox.py", "resume", "Command(resume="),               # 恢复图
])
def test_the_four_places_a_learner_looks_for_are_on_the_first_screens_of_the_lesson_file(file, function, must_contain):
    source = (HERE / file).read_text(encoding="utf-8")
    node = next(n for n in ast.parse(source).body if getattr(n, "name", None) == function)
    assert node.lineno <= 160, f"{file} 的 {function}() 在第 {node.lineno} 行"
    assert must_contain in "\n".join(source.splitlines()[:node.end_lineno])  # 在它里面,或者在它前面的 SQL 里


def test_lesson_files_stay_short_and_the_modules_beside_them_say_what_they_add():
    for path in sorted(HERE.glob("*.py")):
        lines = path.read_text(encoding="utf-8").count("\n")
        if path.name in LESSON_FILES:
            assert lines <= 400, f"{path.name} 有 {lines} 行"
            continue
        assert lines <= 500, f"{path.name} 有 {lines} 行"
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert docstring, f"{path.name} 开头没有说明它补了什么"


def test_readme_and_docs_stay_within_their_length():
    assert README.count("\n") <= 250 and len(README) <= 25_000
    for doc in (HERE / "docs").glob("*.md"):
        assert doc.read_text(encoding="utf-8").count("\n") <= 300, doc.name


def test_code_and_docs_say_what_the_code_does_not_what_it_used_to_do():
    texts = [*HERE.glob("*.py"), HERE / "README.md", *(HERE / "docs").glob("*.md")]
    for path in texts:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert "原来" not in line, f"{path.name}:{number}: {line.strip()}"
