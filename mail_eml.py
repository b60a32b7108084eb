"""给 email_poller.py 的离线模式(--eml)展开命令行给的文件和目录:目录里的 .eml 不分扩展名大小写;断了的符号链接也列出来,
读的时候说明它指向哪里;空路径、管道、没有权限的目录在收任何一封信之前就报设置错误;文件名不是 UTF-8 时按 \\xNN 打印。
课文没有离线模式;有了它,不连邮箱也能让一封 .eml 走一遍 parse() 和 to_event()(练习 5 的投诉邮件就这样造),
而脚本里给错了路径时,不会收了一半才失败。"""
import os
from pathlib import Path

from mail_imap import SetupError


def eml_files(paths: list[str]) -> list[Path]:
    """展开命令行给的文件和目录;有一个不存在就整个不做(SetupError),免得做了一半。"""
    files: list[Path] = []
    for given in paths:
        if not given.strip():  # --eml "$DIR",变量是空的:Path("") 是当前目录,不能把这里的 .eml 全收进来
            raise SetupError("--eml 给的路径是空的(要读当前目录,写 --eml .)")
        p = Path(given)
        try:
            if p.is_dir():
                # 扩展名不分大小写(x.EML、x.Eml 也算,和直接给文件时一样);名字像 x.eml 的子目录不算。
                # 指向不存在的文件的符号链接算进来:读的时候说一声,那封信不会悄悄没了下文
                found = sorted(f for f in p.iterdir() if f.name.lower().endswith(".eml")
                               and (f.is_file() or dangling(f)))
                if not found:
                    raise SetupError(f"目录里没有 .eml 文件:{shown(given)}")
                files += found
            elif p.is_file():
                files.append(p)
            elif p.exists():  # 管道、设备文件:在,只是不是文件
                raise SetupError(f"不是普通文件或目录:{shown(given)}")
            elif dangling(p):
                raise SetupError(f"找不到文件或目录:{shown(given)}{link_note(p)}")
            else:
                raise SetupError(f"找不到文件或目录:{shown(given)}")
        except OSError as e:  # 目录没有读或进入的权限、名字太长
            raise SetupError(f"读不了 {shown(given)}:{e.strerror or e}") from e
    return files


def dangling(p: Path) -> bool:
    """p 是符号链接,指向的东西却不在了(文件被移走、链接写错)。"""
    return p.is_symlink() and not p.exists()


def link_note(p: Path) -> str:
    """说明这是一个断了的符号链接、指向哪里;读不到链接本身时不多说。"""
    try:
        return f"(它是符号链接,指向的 {shown(os.readlink(p))} 不存在)"
    except OSError:
        return ""


def shown(path: str | Path) -> str:
    """打印出来的文件名:不是 UTF-8 的字节(Windows 压缩包解出来的 GBK 文件名常这样)写成 \\xNN。原样打印的话,
    标准输出是严格的 UTF-8 时(PYTHONIOENCODING=utf-8:strict)报 UnicodeEncodeError,每次重跑都崩在这个文件上。"""
    return os.fsencode(path).decode("utf-8", "backslashreplace")
