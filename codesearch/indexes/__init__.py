"""indexes"""
